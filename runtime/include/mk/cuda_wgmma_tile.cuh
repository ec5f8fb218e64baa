// gemm_tile on Hopper's warpgroup MMA (wgmma), through CuTe: the same contract as the mma.sync
// gemm_tile (cuda_mma_tile.cuh), with x's and the weights' 64-column chunks staged by cp.async
// into 128-byte-swizzled K-major shared memory, which the two warpgroups' wgmma read directly.
// Where the build finds no CuTe headers (the nvidia-cutlass package, or $CUTLASS_INCLUDE_DIR),
// the same call runs the mma.sync gemm_tile, whose shared memory the emitter reserves too.
#pragma once

#include "mk/cuda_mma_tile.cuh"

#if __has_include(<cute/tensor.hpp>)
#define MK_WITH_CUTE 1
#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <climits>
#include <type_traits>
#endif

namespace mk {
namespace gpu {

#if defined(MK_WITH_CUTE)

// The shapes of one wgmma gemm tile of TM x rows and NT weight rows: x's rows padded to 64 a
// warpgroup (kRows; backends/cuda/mma_tile.py's wgmma_rows), the two warpgroups split along M
// past 64 rows, else along N (or one warpgroup alone when NT does not halve into multiples of
// 8). The stages take 1 KiB of alignment (the swizzle's atom) and (kRows + NT) x 128 bytes each.
template <bool BF16, int TM, int NT, int Stages>
struct WgmmaGemm {
  static_assert(Stages >= 2, "the ring needs a stage to fill while one is read");
  using T = std::conditional_t<BF16, cute::bfloat16_t, cute::half_t>;
  static constexpr int kWgM = TM > 64 ? 2 : 1;
  static constexpr int kWgN = kWgM == 1 && NT % 16 == 0 ? 2 : 1;
  static constexpr int kRows = gemm_rows(TM, 64 * kWgM);
  using Atom = decltype(cute::SM90::GMMA::ss_op_selector<T, T, float,
                                                         cute::Shape<cute::_64, cute::Int<NT / kWgN>, cute::_16>>());
  using Mma = decltype(cute::make_tiled_mma(
      Atom{}, cute::Layout<cute::Shape<cute::Int<kWgM>, cute::Int<kWgN>, cute::_1>>{}));
  using SmemA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                             cute::Shape<cute::Int<kRows>, cute::Int<kGemmKc>, cute::Int<Stages>>{}));
  using SmemB = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                             cute::Shape<cute::Int<NT>, cute::Int<kGemmKc>, cute::Int<Stages>>{}));
  static constexpr int kThreads = cute::size(Mma{});
  static constexpr int kStageBytes = (kRows + NT) * kGemmKc * 2;
};

// ws's slots held in registers: a column's slot found by compares and its fields by selects,
// never by an index, which would keep them in local memory (reloaded from there in every loop
// of a body that spills, as a prefill's did on the H200: ncu, bench/RESULTS.md session 50).
struct GemmSlots {
  int start[kGemmMaxWeights], rows[kGemmMaxWeights];
  const uint16_t* w[kGemmMaxWeights];
  int64_t ld[kGemmMaxWeights];
  float* acc[kGemmMaxWeights];

  __device__ explicit GemmSlots(const GemmWeights& ws) {
#pragma unroll
    for (int i = 0; i < kGemmMaxWeights; ++i) {
      const bool in = i < ws.n;
      start[i] = in ? ws.start[i] : INT_MAX;
      rows[i] = in ? ws.rows[i] : 0;
      w[i] = in ? ws.w[i] : nullptr;
      ld[i] = in ? ws.ld[i] : 0;
      acc[i] = in ? ws.acc[i] : nullptr;
    }
  }
  // The slot of weight row (or sum column) r: the last whose start is at most r.
  __device__ int slot(int r) const {
    int i = 0;
#pragma unroll
    for (int j = 1; j < kGemmMaxWeights; ++j) i += r >= start[j];
    return i;
  }
  // Where the sum of tile column c in `row` goes, with `room` columns of its weight from there
  // on; null in the zero rows between two weights (each rounded up to 8).
  __device__ float* sum_at(int row, int c, int& room) const {
    const int i = slot(c), col = c - pick(i, start), n = pick(i, rows);
    room = n - col;
    return room > 0 ? pick(i, acc) + row * n + col : nullptr;
  }
  template <class V>
  __device__ static V pick(int i, const V (&v)[kGemmMaxWeights]) {
    V out = v[0];
#pragma unroll
    for (int j = 1; j < kGemmMaxWeights; ++j) out = i == j ? v[j] : out;
    return out;
  }
};

// A unit is one thread's 16 bytes of a staged chunk: thread t copies rows t / 8 + 32 j at
// columns (t % 8) * 8 of every chunk. 32 rows of 128 bytes are four whole swizzle atoms of 8
// rows, so unit j's place is unit 0's plus j * kUnitStep, and a chunk's copy is a pointer step.
constexpr uint32_t kUnitStep = 32 * kGemmKc * 2;

// x's units: one row pointer and a stride, rows from TM on zeros (every row below the padded
// MP is in the tile).
template <int Units>
struct XUnits {
  const uint16_t* src;  // unit 0's row at the thread's column
  int64_t step;         // 32 rows of x
  int rows;             // units whose row is below TM
  uint32_t dst, stage_bytes;

  template <class Smem>
  __device__ XUnits(Smem& sa, const uint16_t* x, int64_t x_ld, int tm) {
    const int r = threadIdx.x / 8, col = (threadIdx.x & 7) * 8;
    src = x + r * x_ld + col;
    step = 32 * x_ld;
    rows = tm > r ? (tm - r + 31) / 32 : 0;
    dst = smem_address(&sa(r, col, 0));
    stage_bytes = smem_address(&sa(0, 0, 1)) - smem_address(&sa(0, 0, 0));
  }
  __device__ void copy(int s, int k0, int k, const void* any) const {
    const bool in_k = k0 + (threadIdx.x & 7) * 8 < k;
#pragma unroll
    for (int j = 0; j < Units; ++j) {
      const bool in = j < rows;
      cp_async16(dst + j * kUnitStep + s * stage_bytes, in ? src + j * step + k0 : any, in && in_k);
    }
  }
};

// The weights' units: each weight's rows from its slot's start, zeros up to the next one's and
// past NT.
template <int Units>
struct WeightUnits {
  const uint16_t* src[Units];  // the unit's row at the thread's column, or null: zeros
  uint32_t dst, used, stage_bytes;  // used: bit j where unit j's row is below NT

  template <class Smem>
  __device__ WeightUnits(Smem& sb, const GemmSlots& slots, int nt) {
    const int col = (threadIdx.x & 7) * 8;
    used = 0;
#pragma unroll
    for (int j = 0; j < Units; ++j) {
      const int r = threadIdx.x / 8 + 32 * j;
      const int i = slots.slot(r);
      const int local = r - GemmSlots::pick(i, slots.start);
      const bool in = local < GemmSlots::pick(i, slots.rows);
      src[j] = in ? GemmSlots::pick(i, slots.w) + local * GemmSlots::pick(i, slots.ld) + col : nullptr;
      used |= static_cast<uint32_t>(r < nt) << j;
    }
    dst = smem_address(&sb(threadIdx.x / 8, col, 0));
    stage_bytes = smem_address(&sb(0, 0, 1)) - smem_address(&sb(0, 0, 0));
  }
  __device__ void copy(int s, int k0, int k, const void* any) const {
    const bool in_k = k0 + (threadIdx.x & 7) * 8 < k;
#pragma unroll
    for (int j = 0; j < Units; ++j) {
      if (used >> j & 1) cp_async16(dst + j * kUnitStep + s * stage_bytes, src[j] ? src[j] + k0 : any, src[j] && in_k);
    }
  }
};

// The tile's sums into the body's accumulators in two passes over `stage`, the stages' shared
// memory, free once every warpgroup's products are done: each thread's registers as they lie in
// a dense MP x kLd matrix (addresses known at compile time but for the thread's base), then a
// rolled loop of 4-column runs from it into each weight's sums. The per-element form
// (MK_WGMMA_SLOT_SUMS, and where the stages are too small) unrolls a slot pick and two bounds
// checks per register: ~36 KB of SASS a body, and on the H200 qwen3-0.6b's prefill took 13.08
// against 11.62 ms.
template <int TM, int NT, int kLd, class Acc, class Coords>
__device__ inline void staged_sums(float* stage, bool mma_thread, const Acc& acc, const Coords& coords,
                                   const GemmWeights& ws) {
  __syncthreads();  // every warpgroup's products read the stages last
  if (mma_thread) {
#pragma unroll
    for (int e = 0; e < cute::size(acc); ++e) stage[cute::get<0>(coords(e)) * kLd + cute::get<1>(coords(e))] = acc(e);
  }
  __syncthreads();
  const GemmSlots slots(ws);
  const bool assign = ws.assign;
  for (int u = threadIdx.x; u < TM * (NT / 4); u += blockDim.x) {
    const int row = u / (NT / 4), c = (u % (NT / 4)) * 4;
    int room;
    float* const to = slots.sum_at(row, c, room);
    if (to == nullptr) continue;
    const float4 v = *reinterpret_cast<const float4*>(stage + row * kLd + c);
    if (room >= 4 && (reinterpret_cast<uintptr_t>(to) & 15) == 0) {
      float4 sum = v;
      if (!assign) {
        const float4 was = *reinterpret_cast<const float4*>(to);
        sum = make_float4(v.x + was.x, v.y + was.y, v.z + was.z, v.w + was.w);
      }
      *reinterpret_cast<float4*>(to) = sum;
    } else {
      const float part[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j < room) to[j] = part[j] + (assign ? 0.0f : to[j]);
      }
    }
  }
  __syncthreads();
}

// Shared-memory writes of the generic proxy (cp.async, stores) made visible to wgmma's reads.
__device__ inline void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// gemm_tile's contract (cuda_mma_tile.cuh) with wgmma: every weight's sums added to its acc, x
// scaled by g in place per chunk with Σx² into sum_sq when g is given. MK_INLINE_WALK inlines it
// into every body that calls it: a tile that several bodies share stays a function of its own,
// and its caller's call of it makes ptxas serialize the wgmma (C7510).
#if defined(MK_INLINE_WALK)
#define MK_WGMMA_TILE_INLINE __forceinline__
#else
#define MK_WGMMA_TILE_INLINE
#endif
template <bool BF16, int TM, int NT, int Stages>
__device__ MK_WGMMA_TILE_INLINE void wgmma_gemm_tile(const uint16_t* x, int64_t x_ld, const uint16_t* g, float* sum_sq,
                                const GemmWeights& ws, int k) {
  using namespace cute;
  using G = WgmmaGemm<BF16, TM, NT, Stages>;
  using T = typename G::T;
  constexpr int MP = G::kRows;
  const uint32_t at = smem_address(mk_dynamic_smem);
  uint8_t* const base = mk_dynamic_smem + ((1024 - (at & 1023)) & 1023);
  T* const pa = reinterpret_cast<T*>(base);
  T* const pb = pa + cosize(typename G::SmemA{});
  Tensor sA = make_tensor(make_smem_ptr(pa), typename G::SmemA{});  // (MP, 64, Stages)
  Tensor sB = make_tensor(make_smem_ptr(pb), typename G::SmemB{});  // (NT, 64, Stages)
  bool aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0 && (x_ld & 7) == 0 && (k & 7) == 0;
  for (int i = 0; i < ws.n; ++i) {
    aligned = aligned && (reinterpret_cast<uintptr_t>(ws.w[i]) & 15) == 0 && (ws.ld[i] & 7) == 0;
  }
  const int chunks = (k + kGemmKc - 1) / kGemmKc;
  // With three stages or more one chunk's products run on past the next chunk's barrier (the
  // tensor cores need not drain between chunks), at the cost of one chunk of copy lead.
#ifdef MK_WGMMA_DRAIN
  constexpr int kInFlight = 0;
#else
  constexpr int kInFlight = Stages >= 3 ? 1 : 0;
#endif
  constexpr int kAhead = Stages - 1 - kInFlight;
  static_assert(MP % 32 == 0, "x's units cover whole 32-row groups");
  const XUnits<MP / 32> xu(sA, x, x_ld, TM);
  const WeightUnits<(NT + 31) / 32> wu(sB, GemmSlots(ws), NT);
  auto stage = [&](int c) {
    if (c < chunks) {
      const int s = c % Stages;
      if (aligned) {
        xu.copy(s, c * kGemmKc, k, x);
        wu.copy(s, c * kGemmKc, k, x);
      } else {  // element by element into the swizzled places (a 16-byte unit stays whole)
        auto at_a = [&](int r, int col) { return reinterpret_cast<uint16_t*>(&sA(r, col, s)); };
        gemm_stage(at_a, x, x_ld, TM, MP, c * kGemmKc, k, false);
        for (int i = 0; i < ws.n; ++i) {
          const int pad = (i + 1 < ws.n ? ws.start[i + 1] : NT) - ws.start[i], first = ws.start[i];
          auto at_b = [&](int r, int col) { return reinterpret_cast<uint16_t*>(&sB(first + r, col, s)); };
          gemm_stage(at_b, ws.w[i], ws.ld[i], ws.rows[i], pad, c * kGemmKc, k, false);
        }
      }
    }
    cp_async_commit();  // empty past the last chunk: the wait below counts every group
  };
#pragma unroll
  for (int c = 0; c < kAhead; ++c) stage(c);
  typename G::Mma mma;
  // Known at compile time where both warpgroups multiply: ptxas keeps wgmma pipelined only when
  // it can see every issue waited for.
  const bool mma_thread = G::kThreads == kCudaThreads || threadIdx.x < G::kThreads;
  auto thr = mma.get_thread_slice(threadIdx.x % G::kThreads);
  Tensor tCsA = thr.partition_A(sA);  // (MMA, MMA_M, MMA_K, Stages)
  Tensor tCsB = thr.partition_B(sB);
  Tensor tCrA = thr.make_fragment_A(tCsA);  // wgmma descriptors
  Tensor tCrB = thr.make_fragment_B(tCsB);
  Tensor acc = partition_fragment_C(mma, Shape<Int<MP>, Int<NT>>{});
  clear(acc);
  float ss[kNormSlots<MP>] = {};
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kAhead - 1>();
    fence_async_shared();
    // Chunk c has landed, and every warpgroup has waited for chunk c - 1 - kInFlight's products,
    // so that chunk's stage takes chunk c + kAhead's copies.
    __syncthreads();
    stage(c + kAhead);
    const int s = c % Stages;
    if (g != nullptr) {
      auto at_a = [&](int r, int col) { return reinterpret_cast<uint16_t*>(&sA(r, col, s)); };
      gemm_norm_chunk<BF16, MP>(at_a, g, c * kGemmKc, k, ss);
      fence_async_shared();
      __syncthreads();
    }
    if (mma_thread) {
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      cute::gemm(mma, tCrA(_, _, _, s), tCrB(_, _, _, s), acc);
      warpgroup_commit_batch();
      warpgroup_wait<kInFlight>();
      warpgroup_fence_operand(acc);
    }
  }
  if (mma_thread) {
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  }
  if (g != nullptr && sum_sq != nullptr) add_row_sums<MP>(ss, sum_sq, TM);
  Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<MP>, Int<NT>>{}));
#if !defined(MK_WGMMA_SLOT_SUMS)
  constexpr int kLd = NT + 8;  // a row of the staged sums: 8 banks on from the row above
  if constexpr (MP * kLd * 4 <= Stages * G::kStageBytes) {
    staged_sums<TM, NT, kLd>(reinterpret_cast<float*>(base), mma_thread, acc, coords, ws);
    return;
  }
#endif
  if (mma_thread) {
    // Read from ws again here rather than kept in registers through the K loop.
    const GemmSlots slots(ws);
    const bool assign = ws.assign;
#pragma unroll
    for (int e = 0; e < size(acc); ++e) {
      const int row = get<0>(coords(e)), c0 = get<1>(coords(e));
      if (row >= TM) continue;
      const int i = slots.slot(c0);
      const int col = c0 - GemmSlots::pick(i, slots.start), rows = GemmSlots::pick(i, slots.rows);
      if (col >= rows) continue;
      float* const to = GemmSlots::pick(i, slots.acc) + row * rows + col;
      *to = acc(e) + (assign ? 0.0f : *to);
    }
  }
  __syncthreads();
}

#else  // no CuTe: the mma.sync tile

template <bool BF16, int TM, int NT, int Stages>
__device__ void wgmma_gemm_tile(const uint16_t* x, int64_t x_ld, const uint16_t* g, float* sum_sq,
                                const GemmWeights& ws, int k) {
  gemm_tile<BF16, TM, NT>(x, x_ld, g, sum_sq, ws, k);
}

#endif

}  // namespace gpu
}  // namespace mk
