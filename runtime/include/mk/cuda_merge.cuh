// The merge of split-KV decode attention's partials (backends/cuda/split_merge.py): each split
// leaves an unnormalised output row with its running max and sum, and the merge weighs the splits
// by e^(m - max) as one online softmax would have.
#pragma once

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "mk/cuda_stream.cuh"

namespace mk {
namespace gpu {

// The merge of S split-KV partials of R rows (backends/cuda/split_merge.py): split s's rows are
// one run at o + s·o_ld (W elements a row) and their maxima and sums at m/l + s·ml_ld. Writes
// mx[r] = max_s m, lsum[r] = Σ_s l·w and osum[r·W + j] = Σ_s o·w with w = e^(m − mx), the values
// the graph_def's tile steps compute, its normalisation and stores running after. Each thread
// computes the weights of the rows it writes itself from S broadcast loads, so the only barrier
// is the one at the end; up to kMergeHeld splits are held in registers, all loads in flight at
// once, and more are read twice (the maxima, then the sums).
constexpr int kMergeHeld = 32;

template <int S, int R, int W>
__device__ void merge_splits(const float* o, int64_t o_ld, const float* m, const float* l,
                             int64_t ml_ld, float* mx, float* lsum, float* osum) {
  MK_FOR_EACH_U32(e, R * W) {
    const uint32_t r = e / W;
    float peak, out = 0.0f, total = 0.0f;
    if constexpr (S <= kMergeHeld) {
      float ms[S], os[S];
#pragma unroll
      for (int s = 0; s < S; ++s) {
        ms[s] = m[s * ml_ld + r];
        os[s] = o[s * o_ld + e];
      }
      peak = ms[0];
#pragma unroll
      for (int s = 1; s < S; ++s) peak = nan_max(peak, ms[s]);
#pragma unroll
      for (int s = 0; s < S; ++s) out = fmaf(os[s], __expf(ms[s] - peak), out);
    } else {
      peak = m[r];
#pragma unroll 8
      for (int s = 1; s < S; ++s) peak = nan_max(peak, m[s * ml_ld + r]);
#pragma unroll 8
      for (int s = 0; s < S; ++s) out = fmaf(o[s * o_ld + e], __expf(m[s * ml_ld + r] - peak), out);
    }
    osum[e] = out;
    if (e % W == 0) {
#pragma unroll 8
      for (int s = 0; s < S; ++s) total = fmaf(l[s * ml_ld + r], __expf(m[s * ml_ld + r] - peak), total);
      mx[r] = peak;
      lsum[r] = total;
    }
  }
  __syncthreads();
}

// One thread's item of merge_rows: four consecutive elements of a row, its row's S maxima and
// sums (one load per warp) and S float4 of o, loaded in one round.
template <int S>
struct MergeItem {
  float ms[S], ls[S];
  float4 os[S];
  int e;  // the item's first element in x
};

template <int S, int W, int Run, int RunLd>
__device__ __forceinline__ void merge_item_load(const float* o, int64_t o_ld, const float* m,
                                                const float* l, int64_t ml_ld, int i,
                                                MergeItem<S>& it) {
  const int r = i / (W / 4), e = i * 4;
  const int p = Run > 0 ? r / Run * RunLd + r % Run : r;  // the partial row
  const int pe = Run > 0 ? p * W + e % W : e;
  it.e = e;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    it.ms[s] = m[s * ml_ld + p];
    it.ls[s] = l[s * ml_ld + p];
    it.os[s] = *reinterpret_cast<const float4*>(o + s * o_ld + pe);
  }
}

template <int S>
__device__ __forceinline__ void merge_item_finish(const MergeItem<S>& it, float empty_below,
                                                  int32_t dtype, float* x) {
  float peak = it.ms[0];
#pragma unroll
  for (int s = 1; s < S; ++s) peak = nan_max(peak, it.ms[s]);
  float total = 0.0f;
  float4 out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int s = 0; s < S; ++s) {
    const float w = __expf(it.ms[s] - peak);  // as the splits' softmax: ex2.approx
    total = fmaf(it.ls[s], w, total);
    out.x = fmaf(it.os[s].x, w, out.x);
    out.y = fmaf(it.os[s].y, w, out.y);
    out.z = fmaf(it.os[s].z, w, out.z);
    out.w = fmaf(it.os[s].w, w, out.w);
  }
  const bool empty = peak < empty_below;
  const float inv = 1.0f / total;
  x[it.e] = round_to(empty ? 0.0f : out.x * inv, dtype);
  x[it.e + 1] = round_to(empty ? 0.0f : out.y * inv, dtype);
  x[it.e + 2] = round_to(empty ? 0.0f : out.z * inv, dtype);
  x[it.e + 3] = round_to(empty ? 0.0f : out.w * inv, dtype);
}

// Every row of S split partials merged and normalised into x (rows × W floats, each rounded to
// `dtype`): x = osum / lsum, or 0 for a row whose max stayed below `empty_below` (it saw no
// visible key). The o-projection's activation, merged where it is staged (mugraph-fuse-loop
// folded the merge into its loop). A thread takes four consecutive elements of a row
// (MergeItem): its loads go out in one round. (Staging the maxima and sums in shared memory
// first, or holding two float4 per split, was slower on the H200: 6.8 and 8.4 against 6.0 µs
// for a qwen3-0.6b o-projection task.) With Run > 0 the rows are runs of Run consecutive
// partial rows, RunLd partial rows apart (a batch's rows of one KV head's query heads,
// mugraph-split-loop); 0: all consecutive. No barrier: the caller's staging barrier follows.
template <int S, int W, int Run = 0, int RunLd = 0>
__device__ void merge_rows(const float* o, int64_t o_ld, const float* m, const float* l,
                           int64_t ml_ld, int rows, float empty_below, int32_t dtype, float* x) {
  static_assert(W % 4 == 0, "merge_rows takes rows of whole float4");
  static_assert(Run == 0 || RunLd >= Run, "runs of partial rows must not overlap");
  const int items = rows * (W / 4);
  for (int i = static_cast<int>(threadIdx.x); i < items; i += static_cast<int>(MK_CTA_THREADS)) {
    MergeItem<S> it;
    merge_item_load<S, W, Run, RunLd>(o, o_ld, m, l, ml_ld, i, it);
    merge_item_finish<S>(it, empty_below, dtype, x);
  }
}

// merge_rows where the items fill some warps and leave others idle (rows · W/4 at most the
// CTA's threads less a warp): the threads of the idle warps run `beside(t, n)` meanwhile, the
// t-th of n such threads (MK_CUDA_MERGE_EARLY=behind: the o-projection's weights asked into
// L2, whose round trip then overlaps the partials' and the merge instead of following them).
// No barrier: the caller's staging barrier follows.
template <int S, int W, int Run = 0, int RunLd = 0, class Beside>
__device__ void merge_rows_beside(const float* o, int64_t o_ld, const float* m, const float* l,
                                  int64_t ml_ld, int rows, float empty_below, int32_t dtype,
                                  float* x, Beside&& beside) {
  static_assert(W % 4 == 0, "merge_rows takes rows of whole float4");
  static_assert(Run == 0 || RunLd >= Run, "runs of partial rows must not overlap");
  const int i = static_cast<int>(threadIdx.x), items = rows * (W / 4);
  const int busy = (items + 31) / 32 * 32;  // the threads of the warps that merge
  if (i < items) {
    MergeItem<S> it;
    merge_item_load<S, W, Run, RunLd>(o, o_ld, m, l, ml_ld, i, it);
    merge_item_finish<S>(it, empty_below, dtype, x);
  } else if (i >= busy) {
    beside(i - busy, static_cast<int>(MK_CTA_THREADS) - busy);
  }
}

}  // namespace gpu
}  // namespace mk
