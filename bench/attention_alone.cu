// One batch-8 decode attention task per CTA, alone on the GPU (128 CTAs, qwen3-0.6b's shape: 512
// keys of head dim 128, 2 query rows), against copy-only streams of the same 33.6 MB: how far
// the tensor-core body is from its bytes, and what a cold instruction cache costs it. Before its
// timed part a CTA may run N × 32 KB of straight-line code (thrash<N>), which evicts the body
// from the SM's instruction cache, and before each launch a kernel may read 160 MB through the
// L2, which evicts it from there too: the megakernel's conditions at every layer.
//
// Build and run on the GPU machine, from the project root:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
//        -Iruntime/include bench/attention_alone.cu -o /tmp/attention_alone && /tmp/attention_alone
// (or `bash bench/on_gpu.sh attention`, which also builds it with each ATTENTION_DEFINES, e.g.
// MK_ATTN_ROWS_FIRST=0: the body's build switches are its header's macros)
// Each row: the median over 50 launches (after 10) of the CUDA-event time and of the mean
// per-CTA time (globaltimer around the body); K/V rotate over 8 copies, more than the L2 holds.
// The "phases" rows split a body's time at its marks (rows prepared, keys walked, merged), and
// the last line checks 8 and 16 keys a warp against a float64 host reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <vector>

// The body's two phase marks (rows prepared, keys walked) as globaltimer stamps of each CTA.
__device__ unsigned long long g_marks[128][2];
__device__ int g_mark_at[128];
#define MK_ATTN_MARK(a)                                                                      \
  do {                                                                                       \
    if (threadIdx.x == 0) {                                                                  \
      unsigned long long now;                                                                \
      asm volatile("mov.u64 %0, %globaltimer;" : "=l"(now));                                 \
      g_marks[blockIdx.x][g_mark_at[blockIdx.x]++ & 1] = now;                                \
    }                                                                                        \
  } while (0)

#include "mk/cuda_attention_mma.cuh"

// 2,000 dependent FMAs with distinct constants (32 KB of SASS): code that must be fetched.
#define MK_F x = fmaf(x, 1.0f + (__COUNTER__ % 9973) * 1e-7f, 1.0f + N);
#define MK_F10 MK_F MK_F MK_F MK_F MK_F MK_F MK_F MK_F MK_F MK_F
#define MK_F100 MK_F10 MK_F10 MK_F10 MK_F10 MK_F10 MK_F10 MK_F10 MK_F10 MK_F10 MK_F10
#define MK_F1000 MK_F100 MK_F100 MK_F100 MK_F100 MK_F100 MK_F100 MK_F100 MK_F100 MK_F100 MK_F100
template <int N>
__device__ __noinline__ float thrash(float x) {
  MK_F1000 MK_F1000
  return x;
}
__device__ __noinline__ float thrash_n(float x, int n) {
  if (n > 0) x = thrash<0>(x);
  if (n > 1) x = thrash<1>(x);
  if (n > 2) x = thrash<2>(x);
  if (n > 3) x = thrash<3>(x);
  if (n > 4) x = thrash<4>(x);
  if (n > 5) x = thrash<5>(x);
  if (n > 6) x = thrash<6>(x);
  if (n > 7) x = thrash<7>(x);
  if (n > 8) x = thrash<8>(x);
  if (n > 9) x = thrash<9>(x);
  return x;
}

using namespace mk;
using namespace mk::gpu;

constexpr int D = 128, KEYS = 512, R = 2, TASKS = 128;
constexpr int64_t REGION = int64_t(KEYS) * D;  // elements of K (or V) per task

__device__ inline uint64_t gtimer() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ uint64_t g_cta_ns[TASKS];
__device__ uint64_t g_phase_ns[TASKS][3];  // rows prepared, keys walked, merged (from the start)

template <int S, bool OPS, int KW = kAttnWarpKeys>
__device__ void att_body(const uint16_t* k, const uint16_t* v, const uint16_t* q, float* out) {
  StreamAttention sa{};
  const int i = blockIdx.x;
  sa.q = q + i * R * D;
  sa.q_dtype = DTYPE_BF16;
  sa.k = k + i * REGION;
  sa.v = v + i * REGION;
  sa.kv_dtype = DTYPE_BF16;
  sa.ld = D;
  sa.keys = KEYS;
  sa.key0 = 0;
  if (OPS) {  // qwen3's QK-norm and RoPE on q and the new key, as the megakernel's att2_o
    sa.q_ops.g = q; sa.q_ops.g_dtype = DTYPE_BF16; sa.q_ops.eps = 1e-6f;
    sa.q_ops.cos = q + 4096; sa.q_ops.sin = q + 8192; sa.q_ops.t_dtype = DTYPE_BF16; sa.q_ops.out_dtype = DTYPE_BF16;
    sa.k_ops = sa.q_ops;
    sa.k_new = q + 256; sa.k_new_dtype = DTYPE_BF16;
    sa.v_new = q + 512; sa.v_new_dtype = DTYPE_BF16;
    sa.new_key = KEYS - 3;
  }
  __shared__ float o[R * D], m[R], l[R];
  sa.o = o; sa.m = m; sa.l = l;
  const float len = 100000.f;
  const auto score = [&](float s, int64_t key) -> float { return static_cast<float>(key) < len ? s * 0.0883883f : -1e30f; };
  stream_attention_mma<R, D, true, S, KW>(sa, score);
  __syncthreads();
  for (int j = threadIdx.x; j < R * D; j += blockDim.x) out[i * R * D + j] = o[j] / l[j / D];
}

template <int S, bool OPS, int KW>
__device__ __noinline__ void att_called(const uint16_t* k, const uint16_t* v, const uint16_t* q, float* out) {
  att_body<S, OPS, KW>(k, v, q, out);
}

template <int S, bool OPS, bool CALL, int THRASH = 0, int KW = kAttnWarpKeys>
__global__ void __launch_bounds__(256, 1) att_kernel(const uint16_t* k, const uint16_t* v, const uint16_t* q, float* out) {
  if (THRASH) {
    const float x = thrash_n(static_cast<float>(threadIdx.x), THRASH);
    if (x == 0.123f) out[0] = x;
  }
  __syncthreads();
  if (threadIdx.x == 0) g_mark_at[blockIdx.x] = 0;
  __syncthreads();
  const uint64_t t0 = gtimer();
  if (CALL) att_called<S, OPS, KW>(k, v, q, out); else att_body<S, OPS, KW>(k, v, q, out);
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t t1 = gtimer();
    g_cta_ns[blockIdx.x] = t1 - t0;
    g_phase_ns[blockIdx.x][0] = g_marks[blockIdx.x][0] - t0;
    g_phase_ns[blockIdx.x][1] = g_marks[blockIdx.x][1] - t0;
    g_phase_ns[blockIdx.x][2] = t1 - t0;
  }
}

// The same bytes, chunks of 64 keys through S cp.async stages, no math.
template <int S>
__global__ void __launch_bounds__(256, 1) copy_kernel(const uint16_t* k, const uint16_t* v, const uint16_t* q, float* out) {
  constexpr int KC = 64, LD = D + 8, STAGE = 2 * KC * LD;
  uint16_t* ring = reinterpret_cast<uint16_t*>(mk_dynamic_smem);
  const int i = blockIdx.x;
  const uint16_t* kk = k + i * REGION;
  const uint16_t* vv = v + i * REGION;
  const int chunks = KEYS / KC;
  const uint64_t t0 = gtimer();
  for (int c = 0; c < S; ++c) stage_kv_chunk<D, KC>(ring + (c % S) * STAGE, kk, vv, D, KEYS, c, true);
  float acc = 0;
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<S - 1>();
    __syncthreads();
    const uint16_t* ks = ring + (c % S) * STAGE;
    acc += ks[threadIdx.x % (KC * LD)];
    __syncthreads();
    stage_kv_chunk<D, KC>(ring + (c % S) * STAGE, kk, vv, D, KEYS, c + S, true);
  }
  cp_async_wait<0>();
  if (acc == 12345.f) out[i] = acc;
  __syncthreads();
  if (threadIdx.x == 0) g_cta_ns[blockIdx.x] = gtimer() - t0;
}

// Register streams: every thread keeps U 16-byte loads in flight.
template <int U>
__global__ void __launch_bounds__(256, 1) ldg_kernel(const uint16_t* k, const uint16_t* v, const uint16_t* q, float* out) {
  const int i = blockIdx.x;
  const uint4* a = reinterpret_cast<const uint4*>(k + i * REGION);
  const uint4* b = reinterpret_cast<const uint4*>(v + i * REGION);
  constexpr int N = REGION * 2 / 16;  // 16-byte units per tensor
  uint32_t acc = 0;
  const uint64_t t0 = gtimer();
  for (int j = threadIdx.x; j < N; j += 256 * U) {
    uint4 x[U], y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      x[u] = __ldg(a + j + u * 256);
      y[u] = __ldg(b + j + u * 256);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= x[u].x ^ y[u].y;
  }
  if (acc == 12345u) out[i] = acc;
  __syncthreads();
  if (threadIdx.x == 0) g_cta_ns[blockIdx.x] = gtimer() - t0;
}

__global__ void empty_kernel(const uint16_t*, const uint16_t*, const uint16_t*, float*) { if (threadIdx.x == 0) g_cta_ns[blockIdx.x] = 0; }

// Reads n units through the L2 (as a decode step's weight streams do), with an evict-first
// policy when EF.
template <bool EF>
__global__ void flush_kernel(uint4* p, size_t n) {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint4 v;
    if (EF) {
      asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i), "l"(policy));
    } else {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
    }
    acc ^= v.x;
  }
  if (acc == 0x12345u) p[0].y = acc;
}
uint4* g_flush = nullptr;
int g_do_flush = 0;  // 1: plain reads, 2: evict-first reads
const size_t kFlushUnits = (160u << 20) / 16;

// The median event time (µs), mean CTA time (µs) and, for the attention kernels, the mean
// µs from a CTA's start to its body's marks (rows prepared, keys walked) and to its end.
struct Timing {
  float event, cta;
  double phase[3];
};

template <class K>
Timing time_it(K kernel, int smem, const std::vector<uint16_t*>& ks, const std::vector<uint16_t*>& vs, const uint16_t* q, float* out) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ms, cta;
  std::vector<double> at[3];
  for (int r = 0; r < 60; ++r) {
    const int b = r % ks.size();  // rotate buffers: more than the L2 holds
    if (g_do_flush == 1) flush_kernel<false><<<264, 512>>>(g_flush, kFlushUnits);
    if (g_do_flush == 2) flush_kernel<true><<<264, 512>>>(g_flush, kFlushUnits);
    cudaEventRecord(e0);
    kernel<<<TASKS, 256, smem>>>(ks[b], vs[b], q, out);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t; cudaEventElapsedTime(&t, e0, e1);
    if (r >= 10) {
      ms.push_back(t);
      uint64_t h[TASKS], p[TASKS][3];
      cudaMemcpyFromSymbol(h, g_cta_ns, sizeof h);
      cudaMemcpyFromSymbol(p, g_phase_ns, sizeof p);
      double sum = 0; for (int j = 0; j < TASKS; ++j) sum += h[j];
      cta.push_back(sum / TASKS / 1e3);
      for (int k = 0; k < 3; ++k) {
        double ps = 0; for (int j = 0; j < TASKS; ++j) ps += p[j][k];
        at[k].push_back(ps / TASKS / 1e3);
      }
    }
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cta.begin(), cta.end());
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) printf("error %s\n", cudaGetErrorString(err));
  Timing out_t{ms[ms.size() / 2] * 1000.f, cta[cta.size() / 2], {}};
  for (int k = 0; k < 3; ++k) {
    std::sort(at[k].begin(), at[k].end());
    out_t.phase[k] = at[k][at[k].size() / 2];
  }
  return out_t;
}


float bf16_value(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; memcpy(&f, &u, 4); return f; }

// Random signed K, V and q against a float64 softmax(q·Kᵀ·scale)·V on the host: the largest
// |mk − ref| / (1 + |ref|) of one launch of the body with KW keys a warp.
template <int KW>
double check_error() {
  const size_t n = size_t(TASKS) * REGION;
  std::vector<uint16_t> hk(n), hv(n), hq(TASKS * R * D);
  uint32_t x = 12345u;
  auto draw = [&] { x = x * 1664525u + 1013904223u; const float f = (x >> 8) / float(1 << 24) * 4.f - 2.f;
                    uint32_t u; memcpy(&u, &f, 4); return uint16_t(u >> 16); };
  for (auto& e : hk) e = draw();
  for (auto& e : hv) e = draw();
  for (auto& e : hq) e = draw();
  uint16_t *k, *v, *q; float* out;
  cudaMalloc(&k, n * 2); cudaMalloc(&v, n * 2); cudaMalloc(&q, hq.size() * 2); cudaMalloc(&out, TASKS * R * D * 4);
  cudaMemcpy(k, hk.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(v, hv.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(out, 0xff, TASKS * R * D * 4);  // NaN: unwritten elements show
  const int smem = mma_attention_smem_bytes(R, D, 2, KW);
  cudaFuncSetAttribute(att_kernel<2, false, false, 0, KW>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  att_kernel<2, false, false, 0, KW><<<TASKS, 256, smem>>>(k, v, q, out);
  std::vector<float> got(TASKS * R * D);
  cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(k); cudaFree(v); cudaFree(q); cudaFree(out);
  if (cudaGetLastError() != cudaSuccess) return 1e9;
  double worst = 0;
  std::vector<double> sc(KEYS);
  for (int i = 0; i < TASKS; ++i)
    for (int r = 0; r < R; ++r) {
      double peak = -1e300;
      for (int j = 0; j < KEYS; ++j) {
        double acc = 0;
        for (int d = 0; d < D; ++d) acc += double(bf16_value(hq[(i * R + r) * D + d])) * bf16_value(hk[i * REGION + j * D + d]);
        sc[j] = acc * 0.0883883;
        peak = std::max(peak, sc[j]);
      }
      double total = 0;
      for (int j = 0; j < KEYS; ++j) total += (sc[j] = std::exp(sc[j] - peak));
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < KEYS; ++j) o += sc[j] * bf16_value(hv[i * REGION + j * D + d]);
        o /= total;
        const double e = std::fabs(got[(i * R + r) * D + d] - o) / (1 + std::fabs(o));
        worst = std::isnan(e) ? 1e9 : std::max(worst, e);
      }
    }
  return worst;
}

int main() {
  const int NB = 8;
  std::vector<uint16_t*> ks(NB), vs(NB);
  const size_t bytes = TASKS * REGION * 2;
  std::vector<uint16_t> host(TASKS * REGION);
  for (size_t j = 0; j < host.size(); ++j) host[j] = 0x3c00 + (j * 2654435761u >> 20) % 512;  // bf16 ~ small values
  for (int b = 0; b < NB; ++b) {
    cudaMalloc(&ks[b], bytes); cudaMalloc(&vs[b], bytes);
    cudaMemcpy(ks[b], host.data(), bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(vs[b], host.data(), bytes, cudaMemcpyHostToDevice);
  }
  uint16_t* q; float* out;
  cudaMalloc(&q, TASKS * R * D * 2); cudaMemcpy(q, host.data(), TASKS * R * D * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&out, TASKS * R * D * 4);
  const double mb = 2.0 * bytes / 1e6;
  auto row = [&](const char* name, Timing r) {
    printf("%-34s event %7.2f us  CTA mean %6.2f us  %6.1f GB/s per CTA\n", name, r.event, r.cta, mb * 1e3 / r.cta / TASKS);
  };
  auto phase_row = [&](const char* name, Timing r) {
    printf("%-34s rows prepared %6.2f us  keys walked %6.2f us (+%5.2f)  merged %6.2f us (+%5.2f)\n",
           name, r.phase[0], r.phase[1], r.phase[1] - r.phase[0], r.phase[2], r.phase[2] - r.phase[1]);
  };
  printf("%d tasks x %d keys x D %d: %.1f MB of K+V\n", TASKS, KEYS, D, mb);
  const int BIG = 155648;  // the qwen3-0.6b batch-8 megakernel's dynamic shared memory (3 stages)
  row("empty launch", time_it(empty_kernel, 0, ks, vs, q, out));
  row("attention mma S=2", time_it(att_kernel<2, false, false>, mma_attention_smem_bytes(R, D, 2), ks, vs, q, out));
  row("attention mma S=2 ops", time_it(att_kernel<2, true, false>, mma_attention_smem_bytes(R, D, 2), ks, vs, q, out));
  row("attention mma S=2 ops call", time_it(att_kernel<2, true, true>, mma_attention_smem_bytes(R, D, 2), ks, vs, q, out));
  row("attention mma S=2 ops call big smem", time_it(att_kernel<2, true, true>, BIG, ks, vs, q, out));
  const Timing s3 = time_it(att_kernel<3, true, true>, BIG, ks, vs, q, out);
  row("attention mma S=3 ops call big smem", s3);
  // 16 keys a warp (chunks of 128 keys): S=2 holds the bytes of 8 keys a warp's S=4.
  const int BIG16 = std::max(BIG, mma_attention_smem_bytes(R, D, 3, 16));
  const Timing kw16 = time_it(att_kernel<2, true, true, 0, 16>, BIG, ks, vs, q, out);
  row("attention mma S=2 ops call big KW16", kw16);
  row("attention mma S=3 ops call big KW16", time_it(att_kernel<3, true, true, 0, 16>, BIG16, ks, vs, q, out));
  row("attention mma S=4 ops call big KW8", time_it(att_kernel<4, true, true, 0, 8>, std::max(BIG, mma_attention_smem_bytes(R, D, 4, 8)), ks, vs, q, out));
  phase_row("phases S=3 ops call big", s3);
  phase_row("phases S=2 ops call big KW16", kw16);
  const double e8 = check_error<8>(), e16 = check_error<16>();
  printf("check against float64 (max |mk - ref| / (1 + |ref|)): KW8 %.2e  KW16 %.2e  %s\n", e8, e16,
         e8 < 2e-2 && e16 < 2e-2 ? "ok" : "FAIL");
  constexpr int ST = 2 * 64 * (D + 8) * 2;
  row("thrash 0 KB (call)", time_it(att_kernel<2, true, true, 0>, BIG, ks, vs, q, out));
  row("thrash 32 KB", time_it(att_kernel<2, true, true, 1>, BIG, ks, vs, q, out));
  row("thrash 64 KB", time_it(att_kernel<2, true, true, 2>, BIG, ks, vs, q, out));
  row("thrash 96 KB", time_it(att_kernel<2, true, true, 3>, BIG, ks, vs, q, out));
  row("thrash 128 KB", time_it(att_kernel<2, true, true, 4>, BIG, ks, vs, q, out));
  row("thrash 160 KB", time_it(att_kernel<2, true, true, 5>, BIG, ks, vs, q, out));
  row("thrash 192 KB", time_it(att_kernel<2, true, true, 6>, BIG, ks, vs, q, out));
  row("thrash 256 KB", time_it(att_kernel<2, true, true, 8>, BIG, ks, vs, q, out));
  row("thrash 320 KB", time_it(att_kernel<2, true, true, 10>, BIG, ks, vs, q, out));
  cudaMalloc(&g_flush, kFlushUnits * 16);
  cudaMemset(g_flush, 1, kFlushUnits * 16);
  g_do_flush = 1;
  row("read 160MB + thrash 0", time_it(att_kernel<2, true, true, 0>, BIG, ks, vs, q, out));
  row("read 160MB + thrash 64 KB", time_it(att_kernel<2, true, true, 2>, BIG, ks, vs, q, out));
  row("read 160MB + thrash 128 KB", time_it(att_kernel<2, true, true, 4>, BIG, ks, vs, q, out));
  row("read 160MB + thrash 192 KB", time_it(att_kernel<2, true, true, 6>, BIG, ks, vs, q, out));
  row("read 160MB + thrash 320 KB", time_it(att_kernel<2, true, true, 10>, BIG, ks, vs, q, out));
  g_do_flush = 0;
  row("cp.async copy S=2", time_it(copy_kernel<2>, 2 * ST, ks, vs, q, out));
  row("ldg U=4", time_it(ldg_kernel<4>, 0, ks, vs, q, out));
  return 0;
}
