// Attention of a block of many query rows (a prefill's) on tensor cores: one task's rows against
// all of its keys, flash-attention style. Each warp owns 16 query rows, keeps their Q fragments,
// scores, online-softmax state and output in registers, and multiplies with m16n8k16 mma; chunks
// of 64 keys (K and V) are staged in shared memory by cp.async, the next ones landing while the
// warps work on this one. The result is the accumulator's final state (o unnormalised, running
// max m, sum l), what the generic tile loop leaves, so the graph_def's epilogue runs on it as is.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "mk/cuda_attention.cuh"
#include "mk/cuda_mma_tile.cuh"

namespace mk {
namespace gpu {

constexpr int kBlockAttentionMaxRows = 128;  // 16 rows for each of the 8 warps
constexpr int kBlockAttentionKeys = 64;      // keys a staged chunk holds
// Chunks in flight. A task without the copies ran a sixth faster than with two stages
// (qwen3-0.6b's prefill on the H200); a third stage, with the float positions below, gained 2 %.
constexpr int kBlockAttentionStages = 3;

struct BlockAttention {
  // Query rows: runs of q_run_rows rows of D contiguous elements, q_run_ld elements apart; row
  // r's query position (the score's third argument) is query0 + r % q_run_rows.
  const uint16_t* q;
  int64_t q_run_rows;
  int64_t q_run_ld;
  int64_t query0;
  const uint16_t* k;  // the task's first key row, D contiguous elements per key, ld apart
  const uint16_t* v;
  int64_t ld;
  int32_t keys;
  int64_t key0;       // the first key's position (the score's second argument)
  float* o;           // [R][D]
  float* m;           // [R]
  float* l;           // [R]
};

// Shared memory of block_attention<R, D>: kBlockAttentionStages stages of a K and a V chunk,
// rows padded by 8 elements so that ldmatrix's eight rows fall in different banks.
__host__ __device__ constexpr int block_attention_smem_bytes(int d) {
  return kBlockAttentionStages * 2 * kBlockAttentionKeys * (d + 8) * 2;
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

template <bool BF16>
__device__ inline uint32_t pack_pair(float lo, float hi) {
  const uint32_t low = float_half_bits<BF16>(lo), high = float_half_bits<BF16>(hi);
  return low | (high << 16);
}

// `n` >= 1 rows of D elements into shared memory rows of D + 8; row i comes from row_at(i),
// zeros for rows [n, pad). 16-byte copies when `aligned`, else element by element.
template <int D, class RowAt>
__device__ inline void block_stage(uint16_t* to, RowAt row_at, int n, int pad, bool aligned) {
  constexpr int units = D / 8;
  for (int i = threadIdx.x; i < pad * units; i += blockDim.x) {
    const int r = i / units, c = (i % units) * 8;
    uint16_t* dst = to + r * (D + 8) + c;
    const bool in = r < n;
    if (aligned) {
      cp_async16(smem_address(dst), in ? row_at(r) + c : row_at(0), in);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) dst[j] = in ? row_at(r)[c + j] : uint16_t{0};
    }
  }
}

// Chunk c of KC keys (the K rows, then the V rows, D + 8 elements apart) into the stage at `to`,
// zeros past the last key. Every call commits a group, empty past the last chunk, so that the
// waits count alike.
template <int D, int KC>
__device__ inline void stage_kv_chunk(uint16_t* to, const uint16_t* k, const uint16_t* v, int64_t ld,
                                      int keys, int c, bool aligned) {
  if (c * KC < keys) {
    const int n = min(KC, keys - c * KC);
    const int64_t first = static_cast<int64_t>(c) * KC;
    block_stage<D>(to, [&](int r) { return k + (first + r) * ld; }, n, KC, aligned);
    block_stage<D>(to + KC * (D + 8), [&](int r) { return v + (first + r) * ld; }, n, KC, aligned);
  }
  cp_async_commit();
}

// All threads of the CTA; BF16: q, K and V are bf16, else f16. Ends with __syncthreads().
// Shared memory: block_attention_smem_bytes(D). score(s, key, query) takes the positions as
// floats (exact below 2^24), the key's as the chunk's first plus the element's offset, not
// converted from int64 at every score (the mask's function took a sixth of a task, qwen3-0.6b's
// prefill on the H200).
template <int R, int D, bool BF16, class Score>
__device__ void block_attention(const BlockAttention& a, Score score) {
  static_assert(R >= 1 && R <= kBlockAttentionMaxRows, "block_attention takes 1..128 query rows");
  static_assert(D % 16 == 0 && D <= 128, "head dim: a multiple of 16 up to 128");
  constexpr int KC = kBlockAttentionKeys, LD = D + 8, WARPS = (R + 15) / 16;
  constexpr int STAGE = 2 * KC * LD;  // elements: a K chunk, then a V chunk
  constexpr int STAGES = kBlockAttentionStages;
  uint16_t* const smem = reinterpret_cast<uint16_t*>(mk_dynamic_smem);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const bool aligned = ((reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v) |
                         reinterpret_cast<uintptr_t>(a.q)) & 15) == 0 &&
                       a.ld % 8 == 0 && a.q_run_ld % 8 == 0;
  const int chunks = (a.keys + KC - 1) / KC;
  auto stage_chunk = [&](int c) {
    stage_kv_chunk<D, KC>(smem + (c % STAGES) * STAGE, a.k, a.v, a.ld, a.keys, c, aligned);
  };
  // Q goes through the last stage (its 2·KC rows hold all 128) while the chunks before it land.
  uint16_t* const q_stage = smem + (STAGES - 1) * STAGE;
  stage_chunk(0);
  block_stage<D>(q_stage,
                 [&](int r) { return a.q + (r / a.q_run_rows) * a.q_run_ld + (r % a.q_run_rows) * D; },
                 R, WARPS * 16, aligned);
  cp_async_commit();
#pragma unroll
  for (int c = 1; c < STAGES - 1; ++c) stage_chunk(c);
  cp_async_wait<STAGES - 2>();  // chunk 0 and Q
  __syncthreads();
  uint32_t qf[D / 16][4];
  if (warp < WARPS) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int row = warp * 16 + lane % 16, col = kk * 16 + (lane / 16) * 8;
      ldmatrix_x4(qf[kk], smem_address(q_stage + row * LD + col));
    }
  }
  __syncthreads();  // the last stage is free for its chunk
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float query[2];
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g + 8 * h;
    query[h] = static_cast<float>(a.query0 + r % a.q_run_rows);
  }
  const float lane_key = static_cast<float>(2 * t);
  for (int c = 0; c < chunks; ++c) {
    stage_chunk(c + STAGES - 1);
    cp_async_wait<STAGES - 1>();  // chunk c has landed; the ones after it may still be copying
    __syncthreads();
    if (warp < WARPS) {
      const uint16_t* ks = smem + (c % STAGES) * STAGE;
      const uint16_t* vs = ks + KC * LD;
      float s[KC / 8][4];
#pragma unroll
      for (int j = 0; j < KC / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < KC / 8; j += 2) {
          uint32_t b[4];
          const int key = j * 8 + (lane / 16) * 8 + lane % 8, col = kk * 16 + ((lane / 8) % 2) * 8;
          ldmatrix_x4(b, smem_address(ks + key * LD + col));
          mma16816<BF16>(s[j], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[0], b[1]);
          mma16816<BF16>(s[j + 1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b[2], b[3]);
        }
      }
      // Scores through the transform; keys past the end and padding rows take -inf.
      float peak[2] = {-INFINITY, -INFINITY};
      const float chunk_key = static_cast<float>(a.key0 + static_cast<int64_t>(c) * KC) + lane_key;
#pragma unroll
      for (int j = 0; j < KC / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2, key = c * KC + j * 8 + 2 * t + e % 2;
          const bool in = key < a.keys && warp * 16 + g + 8 * h < R;
          const float at = chunk_key + static_cast<float>(j * 8 + e % 2);
          s[j][e] = in ? score(s[j][e], at, query[h]) : -INFINITY;
          peak[h] = nan_max(peak[h], s[j][e]);
        }
      }
      float shift[2], rescale[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        peak[h] = nan_max(peak[h], __shfl_xor_sync(0xffffffffu, peak[h], 1));
        peak[h] = nan_max(peak[h], __shfl_xor_sync(0xffffffffu, peak[h], 2));
        const float m_new = nan_max(m[h], peak[h]);
        shift[h] = softmax_shift(m_new);
        rescale[h] = __expf(m[h] - shift[h]);
        m[h] = m_new;
      }
#pragma unroll
      for (int j = 0; j < KC / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = __expf(s[j][e] - shift[e / 2]);
          sum[e / 2] += s[j][e];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) l[h] = l[h] * rescale[h] + sum[h];
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] *= rescale[0];
        o[j][1] *= rescale[0];
        o[j][2] *= rescale[1];
        o[j][3] *= rescale[1];
      }
      // o += p·V with p rounded to the 16-bit type for the tensor cores (the generic loop keeps
      // it in f32; the difference is within the output's own rounding).
#pragma unroll
      for (int kk = 0; kk < KC / 16; ++kk) {
        const uint32_t p0 = pack_pair<BF16>(s[2 * kk][0], s[2 * kk][1]);
        const uint32_t p1 = pack_pair<BF16>(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t p2 = pack_pair<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const uint32_t p3 = pack_pair<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int j = 0; j < D / 8; j += 2) {
          uint32_t b[4];
          const int key = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, col = j * 8 + (lane / 16) * 8;
          ldmatrix_x4_trans(b, smem_address(vs + key * LD + col));
          mma16816<BF16>(o[j], p0, p1, p2, p3, b[0], b[1]);
          mma16816<BF16>(o[j + 1], p0, p1, p2, p3, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is free for chunk c + STAGES
  }
  if (warp < WARPS) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      const int r = warp * 16 + g + 8 * h;
      if (r >= R) continue;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        a.o[r * D + j * 8 + 2 * t] = o[j][2 * h];
        a.o[r * D + j * 8 + 2 * t + 1] = o[j][2 * h + 1];
      }
      if (t == 0) {
        a.m[r] = m[h];
        a.l[r] = l[h];
      }
    }
  }
  __syncthreads();
}

}  // namespace gpu
}  // namespace mk
