// Decode attention on the GPU: one task's part of the keys, streamed once. The query rows live
// in registers; a group of D/8 lanes takes one key at a time (16 bytes of K and of V per lane,
// several keys' loads in flight), reduces the scores with shuffles inside the group and keeps
// its own online-softmax state; the groups' states are merged through shared memory at the end.
// The result is the accumulator's final state (o unnormalised, running max m, sum l), exactly
// what the generic tile loop leaves, so the graph_def's epilogue runs on it unchanged.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "mk/cuda_attention_rows.cuh"
#include "mk/cuda_stream.cuh"

namespace mk {
namespace gpu {

// The exponent's offset for a running max: the max itself, or 0 while it is not finite (as the
// CPU kernel does, so a row that has seen only -inf scores does not turn into NaN).
__device__ inline float softmax_shift(float m) { return isfinite(m) ? m : 0.0f; }

#if defined(MK_ATTN_KV_LATE)
constexpr bool kAttnKvEarly = false;
#else
constexpr bool kAttnKvEarly = true;
#endif

// MK_ATTN_MERGE_SLOTS (MK_CUDA_ATTN_MERGE_WEIGHTS=0): every thread computes the slots' weights
// for each of its elements (merge_slot_states) instead of merge_slot_weights.
#if defined(MK_ATTN_MERGE_SLOTS)
constexpr bool kAttnMergeWeights = false;
#else
constexpr bool kAttnMergeWeights = true;
#endif

// A round of U keys' scores (reduced over the group; -inf for a key past the end) into the
// group's online-softmax state at once: one new max, one rescale of o and l and one exp per key
// and row. Key by key, the softmax was a chain of dependent exps and rescales per key, and the
// batch-8 attention ran at the latency of that chain (bench/RESULTS.md, 2026-12-03). The
// weights go into p (U·R values); the caller adds each key's V row times them.
template <int R, int U>
__device__ inline void softmax_round(float (&o)[R][8], float (&m)[R], float (&l)[R],
                                     float (&p)[U][R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float mn = m[r];
#pragma unroll
    for (int u = 0; u < U; ++u) mn = nan_max(mn, p[u][r]);
    const float shift = softmax_shift(mn), alpha = __expf(m[r] - shift);
    float sum = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      p[u][r] = __expf(p[u][r] - shift);
      sum += p[u][r];
    }
    l[r] = l[r] * alpha + sum;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[r][i] *= alpha;
    m[r] = mn;
  }
}

// The new K/V row's key (task key jn, its rows in `rows` after the query rows) into the
// online-softmax state of slot 0. Every lane computes the score: the group's shuffles need the
// whole warp.
template <int R, int D, class Score>
__device__ inline void add_new_key(const StreamAttention& a, Score& score, const float (&q)[R][8],
                                   int jn, const float* rows, float (&o)[R][8], float (&m)[R],
                                   float (&l)[R]) {
  constexpr int L = D / 8;
  const int slot = static_cast<int>(threadIdx.x) / L, lane = static_cast<int>(threadIdx.x) % L;
  const float* kn = rows + R * D + lane * 8;
  const float* vn = rows + (R + 1) * D + lane * 8;
  float s[1][R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(q[r][i], kn[i], acc);
    s[0][r] = acc;
  }
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1) {
#pragma unroll
    for (int r = 0; r < R; ++r) s[0][r] += __shfl_xor_sync(0xffffffffu, s[0][r], off);
  }
  if (slot != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) s[0][r] = score(s[0][r], a.key0 + jn);
  softmax_round<R, 1>(o, m, l, s);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[r][i] = fmaf(s[0][r], vn[i], o[r][i]);
  }
}

// U keys' loads in flight per slot: MK_ATTN_KEYS (MK_CUDA_ATTN_KEYS) sets them for up to 4
// rows; with 16 slots of 16 lanes a round of 4 keys is 32 KB a CTA, half of what an SM needs
// in flight to stream at its share of HBM.
template <int R>
__host__ __device__ constexpr int attention_slot_keys() {
#if defined(MK_ATTN_KEYS)
  return R <= 4 ? MK_ATTN_KEYS : 2;
#else
  return R <= 4 ? 4 : 2;
#endif
}

// Whether stream_attention issues its first round of keys beside the rows' loads (kEarly), the
// condition a round loaded ahead of the task's scalars (load_keys_ahead) needs too: up to two
// query rows (at four, qwen3-8b's batch 1, the early round's registers made ptxas spill).
template <int R, int D>
__host__ __device__ constexpr bool attention_early_round() {
  return R <= 2 && (R + 2) * (D / 8) <= kCudaThreads;
}

// A round of a slot's U keys (j0, j0 + slots, ... before e): the lane's 16 bytes of each key's
// K and V rows, all in flight before the first is used (zeros past e).
template <int U>
struct KeyRound {
  uint4 k[U], v[U];
};

template <int D, int U, bool Vec>
__device__ inline void load_key_round(const StreamAttention& a, int j0, int e, KeyRound<U>& r) {
  constexpr int L = D / 8;
  const int slots = static_cast<int>(MK_CTA_THREADS) / L, lane = static_cast<int>(threadIdx.x) % L;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = j0 + u * slots;
    r.k[u] = r.v[u] = make_uint4(0, 0, 0, 0);
    if (j < e) {
      r.k[u] = load8<Vec, false>(a.k + j * a.ld + lane * 8);
      r.v[u] = load8<Vec, false>(a.v + j * a.ld + lane * 8);
    }
  }
}

// The K rows of a slot's first round, asked for before the task knows where its keys end
// (load_keys_ahead); the V rows follow once it does.
template <int U>
struct KeysAhead {
  uint4 k[U];
};

// One side (K or V: `rows`, keys `ld` apart) of a round's U keys (j0, j0 + slots, ... before
// e): the lane's 16 bytes of each, zeros past e.
template <int D, int U>
__device__ inline void load_round_rows(const uint16_t* rows, int64_t ld, int j0, int e, uint4 (&r)[U]) {
  constexpr int L = D / 8;
  const int slots = static_cast<int>(MK_CTA_THREADS) / L, lane = static_cast<int>(threadIdx.x) % L;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int j = j0 + u * slots;
    r[u] = j < e ? load8<true, false>(rows + j * ld + lane * 8) : make_uint4(0, 0, 0, 0);
  }
}

// Group size L lanes, U keys' loads in flight per lane: keys b..e-1 of the task (slot s takes
// b + s, b + s + slots, ...) into the state (o, m, l). With First, `first` holds the slot's first
// round where `has_first` (loaded earlier: MK_CUDA_ATTN_KV_EARLY); with Masked that round was
// loaded before e was known (load_keys_ahead), so its keys at or past e are zeroed first: a
// cache's rows past the kv length may hold anything, NaN too, and 0 · NaN would reach o.
template <int R, int D, int U, bool Vec, class Score, bool First = false, bool Masked = false>
__device__ void attention_keys(const StreamAttention& a, Score& score, const float (&q)[R][8], int b,
                               int e, float (&o)[R][8], float (&m)[R], float (&l)[R],
                               const KeyRound<U>& first = KeyRound<U>{}, bool has_first = false) {
  constexpr int L = D / 8;
  const int slots = static_cast<int>(MK_CTA_THREADS) / L;
  const int slot = static_cast<int>(threadIdx.x) / L;
  const bool bf16 = a.kv_dtype == DTYPE_BF16;
  auto load_round = [&](int j0, uint4 (&kr)[U], uint4 (&vr)[U]) {
    KeyRound<U> r;
    load_key_round<D, U, Vec>(a, j0, e, r);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      kr[u] = r.k[u];
      vr[u] = r.v[u];
    }
  };
  // A round's dot products first, then all of their group reductions (independent shuffles
  // that overlap), one softmax update for the round, and the V rows times their weights.
  auto use_round = [&](int j0, const uint4 (&kr)[U], const uint4 (&vr)[U]) {
    float s[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      unpack8(kf, kr[u], bf16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc = fmaf(q[r][i], kf[i], acc);
        s[u][r] = acc;
      }
    }
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int r = 0; r < R; ++r) s[u][r] += __shfl_xor_sync(0xffffffffu, s[u][r], off);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = j0 + u * slots;
#pragma unroll
      for (int r = 0; r < R; ++r) s[u][r] = j < e ? score(s[u][r], a.key0 + j) : -INFINITY;
    }
    softmax_round<R, U>(o, m, l, s);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[8];
      unpack8(vf, vr[u], bf16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < 8; ++i) o[r][i] = fmaf(s[u][r], vf[i], o[r][i]);
      }
    }
  };
  // Every lane runs every round (keys past the end load nothing and update nothing), so the
  // group shuffles always see the whole warp. A round's scores, shuffles and softmax wait for its
  // loads, and the next round's loads for them (issuing them one round ahead, MK_CUDA_ATTN_PIPE,
  // measured level or slower at both batches and was retired).
  for (int j0 = b + slot; j0 - slot < e; j0 += U * slots) {
    uint4 kr[U], vr[U];
    if (First && has_first && j0 == b + slot) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool past = Masked && j0 + u * slots >= e;
        kr[u] = past ? make_uint4(0, 0, 0, 0) : first.k[u];
        vr[u] = past ? make_uint4(0, 0, 0, 0) : first.v[u];
      }
    } else {
      load_round(j0, kr, vr);
    }
    use_round(j0, kr, vr);
  }
}

// All threads of the CTA: the final state of `slots` partial online-softmax states of R rows
// (so [slots][R][D], sm/sl [slots][R] in shared memory) into a.o, a.m and a.l. Ends with
// __syncthreads().
template <int R, int D>
__device__ inline void merge_slot_states(const StreamAttention& a, const float* so, const float* sm,
                                         const float* sl, int slots) {
  // Four slots an iteration: the slots' shared-memory loads overlap, and the loops stay a
  // fraction of the code that a whole unrolling of 16 slots made (qwen3-0.6b's batch-1 attention
  // body 30.7 → 28.3 KB of SASS); the sums keep their order.
  MK_FOR_EACH(e, R * D) {
    const int r = static_cast<int>(e / D);
    float peak = -INFINITY;
#pragma unroll 4
    for (int s = 0; s < slots; ++s) peak = nan_max(peak, sm[s * R + r]);
    const float shift = softmax_shift(peak);
    float out = 0.0f, total = 0.0f;
#pragma unroll 4
    for (int s = 0; s < slots; ++s) {
      const float w = __expf(sm[s * R + r] - shift);
      out = fmaf(w, so[(s * R + r) * D + e % D], out);
      total = fmaf(w, sl[s * R + r], total);
    }
    a.o[e] = out;
    if (e % D == 0) {
      a.m[r] = peak;
      a.l[r] = total;
    }
  }
  __syncthreads();
}

// merge_slot_states with each slot's weight of a row, e^(m_s - shift), computed once (by
// default: a thread per row and slot, into sw [slots][R] behind sl) instead of by
// every thread for each of its elements, beside the row's peak over the slots. The same peaks,
// weights and sums in the same order: the state is bit-identical. Ends with __syncthreads().
template <int R, int D>
__device__ inline void merge_slot_weights(const StreamAttention& a, const float* so, const float* sm,
                                          const float* sl, float* sw, int slots) {
  for (int t = static_cast<int>(threadIdx.x); t < R * slots; t += static_cast<int>(MK_CTA_THREADS)) {
    const int r = t / slots, s = t % slots;
    float peak = -INFINITY;
#pragma unroll 4
    for (int i = 0; i < slots; ++i) peak = nan_max(peak, sm[i * R + r]);
    sw[s * R + r] = __expf(sm[s * R + r] - softmax_shift(peak));
    if (s == 0) a.m[r] = peak;
  }
  __syncthreads();
  MK_FOR_EACH(e, R * D) {
    const int r = static_cast<int>(e / D);
    float out = 0.0f;
#pragma unroll 4
    for (int s = 0; s < slots; ++s) out = fmaf(sw[s * R + r], so[(s * R + r) * D + e % D], out);
    a.o[e] = out;
    if (e % D == 0) {
      float total = 0.0f;
#pragma unroll 4
      for (int s = 0; s < slots; ++s) total = fmaf(sw[s * R + r], sl[s * R + r], total);
      a.l[r] = total;
    }
  }
  __syncthreads();
}

// The K rows of the first round of the task's keys (its slot's keys j < a.keys, the keys before
// the kv length cuts them), asked for before the scalars that cut them arrive:
// stream_attention_ahead takes them and asks for the round's V rows where the early round
// would go out (half the registers held from the start). All threads of the CTA; aligned
// 16-bit caches (StreamAttention::aligned), `keys` the task's keys before any cut.
template <int R, int D>
__device__ inline void load_keys_ahead(const uint16_t* k, int64_t ld, int keys,
                                       KeysAhead<attention_slot_keys<R>()>& ahead) {
  static_assert(R <= 4 && (R + 2) * (D / 8) <= kCudaThreads, "a round ahead of up to 4 rows");
  load_round_rows<D, attention_slot_keys<R>()>(k, ld, static_cast<int>(threadIdx.x) / (D / 8), keys, ahead.k);
}

// All threads of the CTA: the final online-softmax state of R query rows over the task's keys,
// each score passed through score(dot, key position) first. Ends with __syncthreads().
// Shared memory: slots · R · (D + 2) floats (the emitter's StreamAttentionPlan.smem_floats),
// + slots · R unless MK_ATTN_MERGE_SLOTS. With Ahead, `ahead` holds the first round's K rows
// (load_keys_ahead), whose keys past the ones this task takes are zeroed as it uses them.
template <int R, int D, bool Ahead, class Score>
__device__ void stream_attention_keys(const StreamAttention& a, Score score,
                                      const KeysAhead<attention_slot_keys<R>()>* ahead) {
  static_assert(R >= 1 && R <= kAttentionMaxRows, "stream_attention takes 1..8 query rows");
  static_assert(D % 8 == 0 && D / 8 <= 32 && 32 % (D / 8) == 0, "head dim: 8, 16, ..., 256");
  constexpr int L = D / 8, U = attention_slot_keys<R>();
  float o[R][8], m[R], l[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[r][i] = 0.0f;
  }
  const int slots = static_cast<int>(MK_CTA_THREADS) / L;
  const int slot = static_cast<int>(threadIdx.x) / L, lane = static_cast<int>(threadIdx.x) % L;
  // The new key, streamed around: its rows taken from prepare_rows instead of the cache.
  const int jn = new_key_index(a);
  // prepare_rows' (R + 2)·D floats fit in the attention's shared memory for every R and D.
  float* rows = reinterpret_cast<float*>(mk_dynamic_smem);
  float q[R][8];
  const bool vec = (a.aligned || ((reinterpret_cast<uintptr_t>(a.k) | reinterpret_cast<uintptr_t>(a.v)) & 15) == 0) &&
                   a.ld % 8 == 0;
  // The keys' first round (of the keys before the new one) goes out right behind the rows'
  // loads, so its round trip to HBM overlaps theirs and the rows' ops (MK_CUDA_ATTN_KV_EARLY=0:
  // after them), unless it went out ahead of the task's scalars.
  constexpr bool kEarly = Ahead || (kAttnKvEarly && attention_early_round<R, D>());
  KeyRound<U> first;
  if constexpr (Ahead) {
#pragma unroll
    for (int u = 0; u < U; ++u) first.k[u] = ahead->k[u];
  }
  auto load_first = [&] {
    if constexpr (Ahead) {
      load_round_rows<D, U>(a.v, a.ld, slot, jn, first.v);
    } else if (kEarly && vec) {
      load_key_round<D, U, true>(a, slot, jn, first);
    }
  };
  if (prepares_rows(a, jn)) {
    if constexpr (kEarly) {
      prepare_rows_early<R, D>(a, jn < a.keys, jn, rows, load_first);
    } else {
      prepare_rows<R, D>(a, jn < a.keys, jn, rows);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[r][i] = rows[r * D + lane * 8 + i];
    }
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) load_row8(q[r], a.q, a.q_dtype, r * D, lane, a.rows_aligned);
    load_first();
  }
  MK_ATTN_MARK(a);
  // The keys before the new one, then those after it (none in a decode step: it is the last).
#pragma unroll 1
  for (int part = 0; part < (jn + 1 < a.keys ? 2 : 1); ++part) {
    const int b = part == 0 ? 0 : jn + 1, e = part == 0 ? jn : a.keys;
    if (vec) {
      attention_keys<R, D, U, true, Score, kEarly, Ahead>(a, score, q, b, e, o, m, l, first, part == 0);
    } else {
      // Unaligned caches are rare: one key's loads in flight, so the variant costs little code
      // (each body is fetched from a cold instruction cache once per layer).
      attention_keys<R, D, 1, false>(a, score, q, b, e, o, m, l);
    }
  }
  if (jn < a.keys) add_new_key<R, D>(a, score, q, jn, rows, o, m, l);
  float* so = reinterpret_cast<float*>(mk_dynamic_smem);  // [slots][R][D]
  float* sm = so + slots * R * D;                          // [slots][R]
  float* sl = sm + slots * R;
  __syncthreads();
  MK_ATTN_MARK(a);
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int i = 0; i < 8; ++i) so[(slot * R + r) * D + lane * 8 + i] = o[r][i];
    if (lane == 0) {
      sm[slot * R + r] = m[r];
      sl[slot * R + r] = l[r];
    }
  }
  __syncthreads();
  if constexpr (kAttnMergeWeights) {
    merge_slot_weights<R, D>(a, so, sm, sl, sl + slots * R, slots);
  } else {
    merge_slot_states<R, D>(a, so, sm, sl, slots);
  }
}

template <int R, int D, class Score>
__device__ void stream_attention(const StreamAttention& a, Score score) {
  stream_attention_keys<R, D, false>(a, score, nullptr);
}

// stream_attention with its first round's K rows already asked for (load_keys_ahead, same a.k
// and a.ld; a.keys since cut at most).
template <int R, int D, class Score>
__device__ void stream_attention_ahead(const StreamAttention& a, Score score,
                                       const KeysAhead<attention_slot_keys<R>()>& ahead) {
  stream_attention_keys<R, D, true>(a, score, &ahead);
}

}  // namespace gpu
}  // namespace mk
