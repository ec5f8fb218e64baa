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
};

// One thread's 16-byte units of x's or the weights' staged chunks. Thread t copies rows t / 8 +
// 32 j at columns (t % 8) * 8 of every chunk, so each unit's source row and swizzled place are
// worked out once per tile and a chunk's copy is a pointer step per unit.
template <int Units>
struct WgmmaUnits {
  const uint16_t* src[Units];  // the unit's row at the thread's column, or null: zeros
  uint32_t dst[Units];         // its place in stage 0
  bool used[Units];            // the row is in the tile
  uint32_t stage_bytes;

  __device__ void copy(int s, int k0, int k, const void* any) const {
    const bool in_k = k0 + (threadIdx.x & 7) * 8 < k;
#pragma unroll
    for (int j = 0; j < Units; ++j) {
      if (used[j]) cp_async16(dst[j] + s * stage_bytes, src[j] ? src[j] + k0 : any, src[j] && in_k);
    }
  }
};

// x's units: rows past TM are zeros.
template <int Units, class Smem>
__device__ inline void x_units(WgmmaUnits<Units>& u, Smem& sa, const uint16_t* x, int64_t x_ld, int tm, int mp) {
  const int col = (threadIdx.x & 7) * 8;
#pragma unroll
  for (int j = 0; j < Units; ++j) {
    const int r = threadIdx.x / 8 + 32 * j;
    u.used[j] = r < mp;
    u.src[j] = r < tm ? x + r * x_ld + col : nullptr;
    u.dst[j] = smem_address(&sa(r < mp ? r : 0, col, 0));
  }
}

// The weights' units: each weight's rows from ws.start, zeros up to the next one's.
template <int Units, class Smem>
__device__ inline void weight_units(WgmmaUnits<Units>& u, Smem& sb, const GemmWeights& ws, int nt) {
  const int col = (threadIdx.x & 7) * 8;
#pragma unroll
  for (int j = 0; j < Units; ++j) {
    const int r = threadIdx.x / 8 + 32 * j;
    int i = 0;
    while (i + 1 < ws.n && ws.start[i + 1] <= r) ++i;
    const int local = r - ws.start[i];
    u.used[j] = r < nt;
    u.src[j] = local < ws.rows[i] ? ws.w[i] + local * ws.ld[i] + col : nullptr;
    u.dst[j] = smem_address(&sb(r < nt ? r : 0, col, 0));
  }
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
  WgmmaUnits<MP / 32> xu;
  WgmmaUnits<(NT + 31) / 32> wu;
  if (aligned) {
    x_units(xu, sA, x, x_ld, TM, MP);
    weight_units(wu, sB, ws, NT);
    xu.stage_bytes = smem_address(&sA(0, 0, 1)) - smem_address(&sA(0, 0, 0));
    wu.stage_bytes = smem_address(&sB(0, 0, 1)) - smem_address(&sB(0, 0, 0));
  }
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
  if (mma_thread) {
    Tensor coords = thr.partition_C(make_identity_tensor(Shape<Int<MP>, Int<NT>>{}));
#pragma unroll
    for (int e = 0; e < size(acc); ++e) {
      const int row = get<0>(coords(e)), c0 = get<1>(coords(e));
      if (row >= TM) continue;
      int i = 0;
      while (i + 1 < ws.n && ws.start[i + 1] <= c0) ++i;
      const int col = c0 - ws.start[i];
      if (col >= ws.rows[i]) continue;
      float* const to = ws.acc[i] + row * ws.rows[i] + col;
      *to = acc(e) + (ws.assign ? 0.0f : *to);
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
