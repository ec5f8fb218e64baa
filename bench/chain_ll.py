"""The chain's hops by self-validating words (bench/chain.py's ll modes): a value with its flag,
and a sum with the count of its terms, each in one 8-byte word, so that a consumer's load of the
values is its wait (no fence, no counter)."""

from __future__ import annotations

# A counted sum: the top 8 bits count the terms added, the low 56 bits hold the sum in two's
# complement fixed point (2^-30): integer adds, so one 64-bit reduction carries a term and its
# count together, and the sum is the same in any order.
COUNT_SHIFT = 56
FIXED_BITS = 30

LL_SOURCE = (
    """
constexpr int kCountShift = """
    + str(COUNT_SHIFT)
    + """;
constexpr float kFixed = """
    + f"{float(2**FIXED_BITS):.1f}f"
    + """;
"""
    + """
// The ll modes: a value and its flag in one 8-byte store, so a consumer's poll of the values is
// the wait (no fence, no counter, one round trip fewer), as NCCL's LL protocol does.
__device__ __forceinline__ void ll_put(unsigned long long* at, float v) {
  const unsigned long long w = (1ull << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(at), "l"(w) : "memory");
}
__device__ __forceinline__ float ll_take(const unsigned long long* in, float* xs, float* raw) {
  unsigned long long v[K / 256];
  unsigned pending = (1u << (K / 256)) - 1;
  while (pending) {  // every load of a round in flight at once
#pragma unroll
    for (int s = 0; s < K / 256; ++s)
      if (pending & (1u << s))
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v[s]) : "l"(in + threadIdx.x + s * 256) : "memory");
#pragma unroll
    for (int s = 0; s < K / 256; ++s)
      if ((pending & (1u << s)) && (v[s] >> 32) == 1u) pending &= ~(1u << s);
  }
  float ss = 0.f;  // in the plain path's order: the same sums
#pragma unroll
  for (int s = 0; s < K / 256; ++s) {
    const float x = __uint_as_float(static_cast<uint32_t>(v[s]));
    xs[threadIdx.x + s * 256] = x;
    raw[threadIdx.x + s * 256] = x;
    ss += x * x;
  }
  return ss;
}
// A phase of rows writes them; a weightless one forwards its share of the values it read.
// (Every CTA forwards values e = blockIdx.x mod ctas, so the next phase waits for all of them.)
__device__ __forceinline__ void ll_give(unsigned long long* out, int rows, const float* res, const float* raw,
                                        int ctas) {
  for (int r = threadIdx.x; rows > 0 ? r < rows : row_at(blockIdx.x, r, ctas) < K; r += 256) {
    const long long at = row_at(blockIdx.x, r, ctas);
    ll_put(out + at, rows > 0 ? res[r] : raw[at]);
  }
}

// An accumulated phase's term of every output, its count riding with it (the acc modes).
__device__ __forceinline__ void acc_add(unsigned long long* at, float v) {
  const unsigned long long w = (1ull << kCountShift) + static_cast<unsigned long long>(__float2ll_rn(v * kFixed));
  asm volatile("red.relaxed.gpu.global.add.u64 [%0], %1;" ::"l"(at), "l"(w) : "memory");
}
// The terms a counted word holds, and its sum.
__host__ __device__ __forceinline__ unsigned acc_count(unsigned long long w) {
  return static_cast<unsigned>((w + (1ull << (kCountShift - 1))) >> kCountShift);
}
__host__ __device__ __forceinline__ float acc_value(unsigned long long w) {
  const long long s = static_cast<long long>(w - (static_cast<unsigned long long>(acc_count(w)) << kCountShift));
  return static_cast<float>(static_cast<double>(s) / kFixed);
}
// The values of an accumulated phase: each word polled until all `terms` are in.
__device__ __forceinline__ float acc_take(const unsigned long long* in, float* xs, float* raw, unsigned terms) {
  unsigned long long v[K / 256];
  unsigned pending = (1u << (K / 256)) - 1;
  while (pending) {
#pragma unroll
    for (int s = 0; s < K / 256; ++s)
      if (pending & (1u << s))
        asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v[s]) : "l"(in + threadIdx.x + s * 256) : "memory");
#pragma unroll
    for (int s = 0; s < K / 256; ++s)
      if ((pending & (1u << s)) && acc_count(v[s]) == terms) pending &= ~(1u << s);
    if (kAccNap && pending) __nanosleep(kAccNap);  // fewer polls among the terms' reductions
  }
  float ss = 0.f;
#pragma unroll
  for (int s = 0; s < K / 256; ++s) {
    const float x = acc_value(v[s]);
    xs[threadIdx.x + s * 256] = x;
    raw[threadIdx.x + s * 256] = x;
    ss += x * x;
  }
  return ss;
}
// Every CTA adds its rows' values (cycled) to all K outputs: a split-K projection's partial sums,
// by counted words (ll: one 64-bit reduction an output) or by f32 reductions of four outputs
// each (red.add.v4.f32, as mk's fused down projection adds) that a counter then publishes.
__device__ __forceinline__ void acc_give(unsigned long long* words, float* plain, int rows, const float* res) {
  // kAccSpread: each CTA starts at its own quarter, so the CTAs' reductions meet fewer at once
  const int first = kAccSpread ? (blockIdx.x % 4) * 256 : 0;
  if (words) {
    for (int s = 0; s < K; s += 256) {
      const int e = (first + s + threadIdx.x) % K;
      acc_add(words + e, res[e % rows]);
    }
    return;
  }
  for (int q = threadIdx.x; q < K / 4; q += 256) {
    const int e = (first + 4 * q) % K;
    atomicAdd(reinterpret_cast<float4*>(plain + (blockIdx.x % kAccCopies) * K + e),
              make_float4(res[e % rows], res[(e + 1) % rows], res[(e + 2) % rows], res[(e + 3) % rows]));
  }
}
"""
)
