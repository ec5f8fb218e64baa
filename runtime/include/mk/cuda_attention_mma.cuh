// Decode attention on tensor cores (MK_CUDA_ATTN_MMA=1): stream_attention's contract, with the
// task's keys staged in chunks of 64 by cp.async and each warp taking 8 keys of every chunk
// (or chunks of 128 and 16 keys a warp: MK_ATTN_WARP_KEYS below).
// The query rows (at most 8, padded to mma's 16) stay in registers as A fragments; a warp's
// scores are one m16n8k16 product per 16 head elements, and its oᵀ += Vᵀ·pᵀ one m16n8k8 per 16. The
// CUDA-core stream holds its keys' loads in registers and waits out a round trip per round of
// keys (a batch-8 qwen3-0.6b task of 512 keys: 8 rounds, 21.5 µs on the H200); here the next
// chunks land while the warps work on this one, and the first ones while q's rows are prepared.
// The warps' states are merged through shared memory at the end, as the slots' are there.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "mk/cuda_attention.cuh"
#include "mk/cuda_block_attention.cuh"

namespace mk {
namespace gpu {

// MK_ATTN_WARP_KEYS = 8 or 16 (MK_CUDA_ATTN_WARP_KEYS): the keys each warp takes of a staged chunk,
// so a chunk holds 8 times as many. With 16, a warp's scores are two independent mma chains and
// its oᵀ += Vᵀ·pᵀ one m16n8k16 per 16 head elements, over half as many chunks (and barriers).
#if defined(MK_ATTN_WARP_KEYS)
constexpr int kAttnWarpKeys = MK_ATTN_WARP_KEYS;
#else
constexpr int kAttnWarpKeys = 8;
#endif
static_assert(kAttnWarpKeys == 8 || kAttnWarpKeys == 16, "MK_ATTN_WARP_KEYS: 8 or 16");
// The keys a staged chunk holds: the 8 warps'.
__host__ __device__ constexpr int mma_attention_chunk_keys(int warp_keys) { return 8 * warp_keys; }

// MK_ATTN_ROWS_FIRST = N (MK_CUDA_ATTN_ROWS_FIRST=N, 0..4, default 2): the rows' loads go out
// before the chunks' copies, N stages of them between the rows' loads and their ops, the rest
// after; 0 issues every stage first. An SM's loads land in about the order it asks for them:
// behind the copies the rows, and so the first chunk's math, wait until every staged chunk has
// landed, and the next copies go out only then, from an empty pipe (a batch-8 task of eight
// chunks: 14.27 µs alone with 0, 13.09 with 1 to 3; bench/RESULTS.md, sessions 71 and 72).
#if defined(MK_ATTN_ROWS_FIRST)
constexpr int kAttnRowsFirst = MK_ATTN_ROWS_FIRST;
#else
constexpr int kAttnRowsFirst = 2;
#endif

// Shared memory of stream_attention_mma<R, D, BF16, S>: prepare_rows' rows, then S stages of K
// and V chunks (rows padded by 8 elements, as block_attention's); the warps' merge reuses the
// front. The emitter gives a task no more stages than it has chunks, nor than
// MK_CUDA_ATTN_MMA_STAGES (default 3): the room is the kernel's, taken from the L1 of every body.
__host__ __device__ constexpr int mma_attention_rows_bytes(int r, int d) {
  return ((r + 2) * d * 4 + 127) / 128 * 128;
}
__host__ __device__ constexpr int mma_attention_smem_bytes(int r, int d, int stages,
                                                         int warp_keys = kAttnWarpKeys) {
  return mma_attention_rows_bytes(r, d) + stages * 2 * mma_attention_chunk_keys(warp_keys) * (d + 8) * 2;
}

// D += A·B for one m16n8k8 tile: A 16×8 (two packed pairs per lane), B 8×8 (one), D f32.
template <bool BF16>
__device__ inline void mma1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
  }
}

// Query row g's A fragments (rows g + 8 are padding: R <= 8): pairs of elements 2t, 2t + 1 and
// 2t + 8, 2t + 9 of every 16, from the prepared rows or from q itself, in the keys' type. Exact
// where the rows are already of that type (the emitter's condition).
template <int R, int D, bool BF16>
__device__ inline void query_fragments(uint32_t (&qf)[D / 16][2], const StreamAttention& a,
                                       const float* rows, bool prepared, int g, int t) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = kk * 16 + h * 8 + 2 * t;
      float x0 = 0.0f, x1 = 0.0f;
      if (g < R) {
        x0 = prepared ? rows[g * D + c] : load_elem_f(a.q, a.q_dtype, g * D + c);
        x1 = prepared ? rows[g * D + c + 1] : load_elem_f(a.q, a.q_dtype, g * D + c + 1);
      }
      qf[kk][h] = pack_pair<BF16>(x0, x1);
    }
  }
}

// oᵀ's columns are query rows 2t and 2t + 1 (a C fragment's pairs).
__device__ inline void rescale_columns(float (&o)[4], float r0, float r1) {
  o[0] *= r0;
  o[1] *= r1;
  o[2] *= r0;
  o[3] *= r1;
}

template <int R, int D, bool BF16, int STAGES, int KW = kAttnWarpKeys, class Score>
__device__ void stream_attention_mma(const StreamAttention& a, Score score) {
  static_assert(R >= 1 && R <= kAttentionMaxRows, "stream_attention_mma takes 1..8 query rows");
  // Lane groups of D/8 within a warp (prepare_rows), pairs of 16-column steps (ldmatrix x4).
  static_assert(D % 32 == 0 && D <= 128 && 32 % (D / 8) == 0, "head dim: 32, 64 or 128");
  static_assert(STAGES >= 1, "at least one stage");
  static_assert(8 * R * D * 4 + 2 * 8 * R * 4 <= mma_attention_smem_bytes(R, D, STAGES, KW),
                "the warps' merge fits the room of the rows and stages");
  static_assert(KW == 8 || KW == 16, "8 or 16 keys of a chunk a warp");
  static_assert(kCudaThreads / 32 == 8, "a chunk's keys are the 8 warps'");
  constexpr int KC = mma_attention_chunk_keys(KW), LD = D + 8, NT = KW / 8;
  constexpr int STAGE = 2 * KC * LD;  // elements: a K chunk, then a V chunk
  float* rows = reinterpret_cast<float*>(mk_dynamic_smem);
  uint16_t* const ring =
      reinterpret_cast<uint16_t*>(mk_dynamic_smem + mma_attention_rows_bytes(R, D));
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int jn = new_key_index(a);
  const bool aligned =
      (a.aligned || ((reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v)) & 15) == 0) &&
      a.ld % 8 == 0;
  const int chunks = (a.keys + KC - 1) / KC;
  auto stage_chunk = [&](int c) {
    stage_kv_chunk<D, KC>(ring + (c % STAGES) * STAGE, a.k, a.v, a.ld, a.keys, c, aligned);
  };
  constexpr int kEarly = kAttnRowsFirst < STAGES ? kAttnRowsFirst : STAGES;
  auto stage_early = [&] {
#pragma unroll
    for (int c = 0; c < kEarly; ++c) stage_chunk(c);
  };
  // The rows' ops run while the first chunks land.
  const bool prepared = prepares_rows(a, jn);
  const bool rows_first = kAttnRowsFirst > 0 && prepared;
  if (rows_first) prepare_rows_early<R, D>(a, jn < a.keys, jn, rows, stage_early);
#pragma unroll
  for (int c = rows_first ? kEarly : 0; c < STAGES; ++c) stage_chunk(c);
  if (!rows_first && prepared) prepare_rows<R, D>(a, jn < a.keys, jn, rows);
  uint32_t qf[D / 16][2];
  query_fragments<R, D, BF16>(qf, a, rows, prepared, g, t);
  MK_ATTN_MARK(a);
  // o transposed (oᵀ = Vᵀ·pᵀ: 16 head elements × 8 query rows a tile, so no tile row is padding):
  // o[dm] holds rows 2t, 2t + 1 of head elements dm·16 + g and dm·16 + g + 8.
  float o[D / 16][4];
#pragma unroll
  for (int dm = 0; dm < D / 16; ++dm) o[dm][0] = o[dm][1] = o[dm][2] = o[dm][3] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // row g's
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<STAGES - 1>();  // chunk c has landed; the ones after it may still be copying
    __syncthreads();
    uint16_t* const ks = ring + (c % STAGES) * STAGE;
    uint16_t* const vs = ks + KC * LD;
    if (jn / KC == c && jn < a.keys) {  // the new rows stand for the cache's (not yet written)
      const int r = jn % KC;
      for (int i = static_cast<int>(threadIdx.x); i < D; i += static_cast<int>(MK_CTA_THREADS)) {
        ks[r * LD + i] = float_half_bits<BF16>(rows[R * D + i]);
        vs[r * LD + i] = float_half_bits<BF16>(rows[(R + 1) * D + i]);
      }
      __syncthreads();
    }
    const uint16_t* const kw = ks + warp * KW * LD;  // this warp's KW keys
    const uint16_t* const vw = vs + warp * KW * LD;
    float s[NT][4];  // one n8 tile of keys each: independent chains
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t b[4];
        ldmatrix_x4(b, smem_address(kw + (n * 8 + lane % 8) * LD + kk * 16 + (lane / 8) * 8));
        mma16816<BF16>(s[n], qf[kk][0], 0u, qf[kk][1], 0u, b[0], b[1]);
        mma16816<BF16>(s[n], qf[kk + 1][0], 0u, qf[kk + 1][1], 0u, b[2], b[3]);
      }
    }
    // Row g's scores of keys n·8 + 2t and n·8 + 2t + 1 (s[n][2], s[n][3] are the padding rows').
    float peak = -INFINITY;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = c * KC + warp * KW + n * 8 + 2 * t + e;
        s[n][e] = g < R && key < a.keys ? score(s[n][e], a.key0 + key) : -INFINITY;
        peak = nan_max(peak, s[n][e]);
      }
    }
    peak = nan_max(peak, __shfl_xor_sync(0xffffffffu, peak, 1));
    peak = nan_max(peak, __shfl_xor_sync(0xffffffffu, peak, 2));
    const float m_new = nan_max(m, peak);
    const float shift = softmax_shift(m_new);
    const float rescale = __expf(m - shift);
    m = m_new;
    // pᵀ's B fragments are row g's pairs as they stand; the rescales of rows 2t and 2t + 1.
    uint32_t pb[NT];
    l *= rescale;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float p0 = __expf(s[n][0] - shift), p1 = __expf(s[n][1] - shift);
      l = l + p0 + p1;
      pb[n] = pack_pair<BF16>(p0, p1);
    }
    const float r0 = __shfl_sync(0xffffffffu, rescale, 8 * t);
    const float r1 = __shfl_sync(0xffffffffu, rescale, 8 * t + 4);
    if constexpr (KW == 8) {
#pragma unroll
      for (int dm = 0; dm < D / 16; dm += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_address(vw + (lane % 8) * LD + dm * 16 + (lane / 8) * 8));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          rescale_columns(o[dm + h], r0, r1);
          mma1688<BF16>(o[dm + h], b[2 * h], b[2 * h + 1], pb[0]);
        }
      }
    } else {
      // Vᵀ's 16×16 A tile of head elements dm·16.. and the warp's 16 keys: matrices (keys 0-7,
      // elements 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15), each transposed.
#pragma unroll
      for (int dm = 0; dm < D / 16; ++dm) {
        uint32_t av[4];
        ldmatrix_x4_trans(av, smem_address(vw + (lane % 8 + (lane / 16) * 8) * LD + dm * 16 +
                                           ((lane / 8) % 2) * 8));
        rescale_columns(o[dm], r0, r1);
        mma16816<BF16>(o[dm], av[0], av[1], av[2], av[3], pb[0], pb[NT - 1]);
      }
    }
    __syncthreads();  // this stage is free for chunk c + STAGES
    stage_chunk(c + STAGES);
  }
  cp_async_wait<0>();  // the empty groups past the last chunk
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* so = reinterpret_cast<float*>(mk_dynamic_smem);  // [8 warps][R][D]
  float* sm = so + 8 * R * D;                             // [8][R]
  float* sl = sm + 8 * R;
  __syncthreads();
  MK_ATTN_MARK(a);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int r = 2 * t + e;
    if (r >= R) continue;
#pragma unroll
    for (int dm = 0; dm < D / 16; ++dm) {
      so[(warp * R + r) * D + dm * 16 + g] = o[dm][e];
      so[(warp * R + r) * D + dm * 16 + g + 8] = o[dm][e + 2];
    }
  }
  if (g < R && t == 0) {
    sm[warp * R + g] = m;
    sl[warp * R + g] = l;
  }
  __syncthreads();
  merge_slot_states<R, D>(a, so, sm, sl, kCudaThreads / 32);
}

}  // namespace gpu
}  // namespace mk
