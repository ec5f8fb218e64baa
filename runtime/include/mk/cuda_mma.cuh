// The tensor-core products of a decode-shaped linear (cuda_stream.cuh): m16n8k16 mma over
// weight rows streamed from global memory, for 2..16 activation rows.
#pragma once

#include <stdint.h>

#include "mk/cuda_arena.h"
#include "mk/cuda_stage.cuh"
#include "mk/cuda_stream_rows.cuh"

namespace mk {
namespace gpu {

// D += A·B for one m16n8k16 tile: A 16×16 (four packed pairs per lane), B 16×8 (two), D f32.
template <bool BF16>
__device__ inline void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Columns [k, k + 8) of staged activation row m, packed when staged (four pairs of the
// weights' 16-bit type); zeros for m >= M.
template <int M>
__device__ inline uint4 act8(const uint16_t* xs, int stride, int m, int k) {
  if (m >= M) return make_uint4(0, 0, 0, 0);
  return *reinterpret_cast<const uint4*>(xs + m * stride + k);
}

#if defined(MK_MMA_PIPE)
constexpr bool kMmaPipe = true;
#else
constexpr bool kMmaPipe = false;
#endif

#if defined(MK_MMA_L1)
constexpr bool kMmaL1 = true;
#else
constexpr bool kMmaL1 = false;
#endif

// One lane's weight vectors of N 32-column steps from column k of its row (zeros past k1 or
// for a missing row: no load). With MK_MMA_L1 they come through the L1
// (load_stream_l1): a warp-wide load asks for 64 bytes of each of eight rows, and the next
// step's load for the other half of the same 128-byte lines, which can then wait on one line
// request.
// Steps [From, To) only, where a round's first steps went out early (mma_first_round).
template <int N, int From = 0, int To = N>
__device__ inline void mma_load(uint4 (&w)[N], const uint16_t* wp, int k, int k1, int t) {
#pragma unroll
  for (int u = From; u < To; ++u) {
    const bool in = wp && k + 32 * u < k1;
    const uint16_t* at = wp + k + 32 * u + 8 * t;
    w[u] = !in ? make_uint4(0, 0, 0, 0) : kMmaL1 ? load_stream_l1(at) : load8<true>(at);
  }
}

// Independent accumulators on tensor cores: consecutive mma go to different ones, so a warp's
// mma are not one chain of dependent instructions (ncu on the gated MLP at batch 8 with a single
// accumulator: "wait" and short-scoreboard stalls led, DRAM 42 %).
constexpr int kMmaChains = 4;

// The mma of N 32-column steps from column k (none past k1) on weight vectors w.
template <int M, int N, bool BF16>
__device__ inline void mma_steps(float (&d)[kMmaChains][4], const uint4 (&w)[N], const uint16_t* xs,
                                 int stride, int g, int t, int k, int k1) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    if (k + 32 * u >= k1) break;  // the same for the whole warp
    const int kk = k + 32 * u + 8 * t;
    const uint4 lo = act8<M>(xs, stride, g, kk), hi = act8<M>(xs, stride, g + 8, kk);
    mma16816<BF16>(d[(2 * u) % kMmaChains], lo.x, hi.x, lo.y, hi.y, w[u].x, w[u].y);
    mma16816<BF16>(d[(2 * u + 1) % kMmaChains], lo.z, hi.z, lo.w, hi.w, w[u].z, w[u].w);
  }
}

// Lane (g, t)'s weight row of the 8 rows [r0, r0 + 8) at chunk column c (row r0 + g); null
// past the last row. (Whole 128-byte lines, shuffled into fragments, measured level on the
// gated MLP at batch 8 and slower on the models.)
__device__ inline const uint16_t* mma_row_pointer(const StreamLinear& s, int64_t c, int r0, int rows) {
  const int row = r0 + static_cast<int>((threadIdx.x & 31) >> 2);
  float* unused;
  int32_t unused_rows;
  return row < rows ? weight_row(s, row, c, &unused, &unused_rows) : nullptr;
}

// mma_rows' work in the caller's frame: where `early`, w already holds the first Early steps
// of the round of columns [k0, k0 + 32U) (mma_first_round), and the loop loads the rest of it.
template <int M, int U, bool BF16, int Early>
__device__ __forceinline__ void mma_rows_from(const StreamLinear& s, const uint16_t* xs, int stride,
                                              int64_t c, int r0, int rows, int k0, int k1,
                                              uint4 (&w)[U], bool early = false) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const uint16_t* const wp = mma_row_pointer(s, c, r0, rows);
  auto load = [&](auto& v, int k) { mma_load<sizeof(v) / sizeof(v[0])>(v, wp, k, k1, t); };
  float d[kMmaChains][4];
#pragma unroll
  for (int a = 0; a < kMmaChains; ++a) d[a][0] = d[a][1] = d[a][2] = d[a][3] = 0.0f;
  if constexpr (kMmaPipe && U > 1 && Early == 0) {
    constexpr int H = U / 2;
    uint4 wa[H], wb[H];
    load(wa, k0);
    for (int k = k0; k < k1; k += 64 * H) {
      load(wb, k + 32 * H);
      mma_steps<M, H, BF16>(d, wa, xs, stride, g, t, k, k1);
      load(wa, k + 64 * H);
      mma_steps<M, H, BF16>(d, wb, xs, stride, g, t, k + 32 * H, k1);
    }
  } else {
    for (int k = k0; k < k1; k += 32 * U) {
      if (Early == 0 || !early || k != k0) {
        load(w, k);
      } else {
        mma_load<U, Early>(w, wp, k, k1, t);
      }
      mma_steps<M, U, BF16>(d, w, xs, stride, g, t, k, k1);
    }
  }
#pragma unroll
  for (int a = 1; a < kMmaChains; ++a)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[0][e] += d[a][e];
  // d[0][2h + e]: activation row g + 8h, weight row r0 + 2t + e. Other warps may add to the same
  // sums (their own columns), hence the atomics.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int m = g + 8 * h, row = r0 + 2 * t + e;
      float* out;
      int32_t n;
      if (m < M && row < rows && weight_row(s, row, c, &out, &n)) atomicAdd(out + m * n, d[0][2 * h + e]);
    }
  }
}

// One warp on tensor cores: weight rows [r0, r0 + 8) times the staged activation rows (M <= 16,
// the A operand padded to 16 with zeros) over columns [k0, k1) of the chunk, multiples of 32.
// Lane (g, t) = (lane / 4, lane % 4) streams weight row r0 + g, 16 bytes at column k + 8t of
// each 32-column step. Inside a step the k order is permuted alike for A and B (a sum does not
// mind), so both operands are plain 16-byte vectors: for mma j, B is the lane's weight pairs 2j
// and 2j + 1 and A the packed activation pairs 2j and 2j + 1 of the same eight columns (rows g
// and g + 8). U steps' loads are in flight before the first mma; with MK_MMA_PIPE
// (MK_CUDA_MMA_PIPE=1) two halves of U/2 steps alternate, one half's loads in flight while the
// other's mma run.
template <int M, int U, bool BF16>
__device__ void mma_rows(const StreamLinear& s, const uint16_t* xs, int stride, int64_t c, int r0,
                         int rows, int k0, int k1) {
  uint4 w[U];
  mma_rows_from<M, U, BF16, 0>(s, xs, stride, c, r0, rows, k0, k1, w);
}

// ------------------------------------------------------------------ the cp.async ring (Ring)
// Loaded straight into mma fragments, a warp-wide 16-byte load reads 64 bytes of each of eight
// rows (lane (g, t) must hold row g). The ring instead copies whole 512-byte row segments, one
// row per warp-wide cp.async, into shared memory, a few stages ahead per warp, and the mma read
// their fragments from there: every request is a full line, and the loads in flight hold no
// registers.
// (MK_CUDA_RING_COLS=512, rows of 512 columns a stage, measured no gain and was retired.)
constexpr int kRingCols = 256;  // columns per stage: eight 32-column steps (stream.RING_COLS)
constexpr int kRingStageBytes = 8 * kRingCols * 2;      // eight rows of 16-bit weights
constexpr int ring_bytes(int stages) { return 8 * stages * kRingStageBytes; }  // all warps

// A stage's row i holds columns [0, 256) with its two 64-byte halves of every 128 bytes swapped
// on odd rows, so that the eight lanes one LDS.128 phase serves (rows g and g + 1, four lanes
// each) fall in different banks.
__device__ inline int ring_col(int row, int col) { return col ^ ((row & 1) << 5); }

// One warp: columns [kb, kb + kRingCols) (none at or past k1) of its eight rows into a stage;
// lane i < 8 holds row i's pointer (`mine`, null for a missing row), so the warp keeps one
// pointer a lane instead of eight. A missing row or column is zero-filled. Row 0 is never
// missing (a unit starts at a row).
__device__ inline void ring_fill(uint16_t* stage, const uint16_t* mine, int kb, int k1, int lane) {
  const auto bits = reinterpret_cast<uintptr_t>(mine);
  const uint16_t* first = nullptr;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const auto row = reinterpret_cast<const uint16_t*>(
        static_cast<uintptr_t>(__shfl_sync(0xffffffffu, static_cast<unsigned long long>(bits), i)));
    if (i == 0) first = row;
#pragma unroll
    for (int h = 0; h < kRingCols; h += 256) {
      const int col = kb + h + 8 * lane;
      const bool in = row != nullptr && col < k1;
      const uint16_t* src = in ? row + col : first;  // not read: any address of the weight
      cp_async16(smem_address(stage + i * kRingCols + ring_col(i, h + 8 * lane)), src, in);
    }
  }
}

// Columns [k0, k1) of the column slice that mma_chunk's unit takes (mma_slices cut `steps`
// 32-column steps into `slices`; slice unit / blocks).
__device__ inline void mma_unit_columns(int unit, int blocks, int slices, int steps, int& k0,
                                        int& k1) {
  const int sl = unit / blocks;
  k0 = steps * sl / slices * 32;
  k1 = (sl + 1 == slices ? steps : steps * (sl + 1) / slices) * 32;
}

// Row r0 + (lane % 8) of unit `unit` (rows [r0, r0 + 8), r0 = 8·(unit % blocks)) at chunk
// column c; null past the last row.
__device__ inline const uint16_t* mma_unit_row(const StreamLinear& s, int unit, int blocks,
                                               int rows, int64_t c, int lane) {
  float* unused;
  int32_t unused_rows;
  const int row = unit % blocks * 8 + (lane & 7);
  return row < rows ? weight_row(s, row, c, &unused, &unused_rows) : nullptr;
}

// The chunks of K a ring walks: chunk i is columns [c0 + i·kc, ...) up to k_end, cut into
// (block, column slice) units by mma_slices as mma_chunk cuts them. Every chunk but the last has
// the same steps and slices, settled once here: the walk asks for them at every stage and unit,
// and a 64-bit division or mma_slices' loop each time costs instructions on every warp's path.
struct RingChunks {
  int64_t c0;
  int kc, blocks, n;
  int full_steps, last_steps, full_slices, last_slices;
  __device__ RingChunks(int64_t c0_, int64_t k_end, int kc_, int blocks_);
  __device__ int count() const { return n; }
  __device__ int64_t column(int i) const { return c0 + static_cast<int64_t>(i) * kc; }
  __device__ int steps(int i) const { return i + 1 < n ? full_steps : last_steps; }
  __device__ int slices(int i) const { return i + 1 < n ? full_slices : last_slices; }
};

// A warp's fill cursor: its next stage is columns [k, k + kRingCols) (none at or past k1) of unit u
// of chunk i; lane l < 8 holds the unit's row l (`mine`). It runs ahead of the products across
// unit and chunk boundaries, so the ring never drains inside a task.
struct RingFill {
  const StreamLinear& s;
  const RingChunks& ch;
  int rows, warp, lane, i, u, units, slices, k, k1;
  const uint16_t* mine;

  __device__ RingFill(const StreamLinear& s_, const RingChunks& ch_, int rows_, int warp_, int lane_)
      : s(s_), ch(ch_), rows(rows_), warp(warp_), lane(lane_), i(-1), u(0), units(0), slices(1),
        k(0), k1(0), mine(nullptr) {
    next_chunk();
  }
  __device__ bool done() const { return i >= ch.count(); }
  // This warp's first unit in a chunk after i (chunks where it has none are skipped).
  __device__ void next_chunk() {
    for (++i; i < ch.count(); ++i) {
      slices = ch.slices(i);
      units = ch.blocks * slices;
      if (warp < units) {
        u = warp;
        enter_unit();
        return;
      }
    }
  }
  __device__ void enter_unit() {
    mma_unit_columns(u, ch.blocks, slices, ch.steps(i), k, k1);
    mine = mma_unit_row(s, u, ch.blocks, rows, ch.column(i), lane);
  }
  // Copies the next stage into `stage` (nothing once the walk is over) and moves on.
  __device__ void fill(uint16_t* stage) {
    if (!done()) {
      ring_fill(stage, mine, k, k1, lane);
      k += kRingCols;
      if (k >= k1) {
        u += kCudaThreads / 32;
        if (u < units) {
          enter_unit();
        } else {
          next_chunk();
        }
      }
    }
    cp_async_commit();
  }
};

// One warp on tensor cores over all of its units of every chunk of `ch` (in each chunk units
// warp, warp + warps, ...), the weights through its D-stage ring (D - 1 stages in flight) as one
// stream. `act(i)` is chunk i's packed activation (it may wait for it to land); `leave(i)` says
// the warp is done reading it. Both run on every thread of the CTA, for every chunk, in order
// (leave may hold a CTA barrier). A ring per unit lost on the small batch-8 linears, and one
// per chunk drained it every 4-6 stages of the gated MLP's down projection (bench/RESULTS.md).
// The same sums as mma_rows.
template <int M, int D, bool BF16, class Act, class Leave>
__device__ void mma_ring_walk(const StreamLinear& s, const RingChunks& ch, int stride, int rows,
                              uint16_t* ring, Act&& act, Leave&& leave) {
  static_assert(D >= 2, "a ring has at least two stages");
  constexpr int warps = kCudaThreads / 32;
  constexpr int kStage = kRingStageBytes / 2;  // elements
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = threadIdx.x & 31, g = lane >> 2,
            t = lane & 3;
  RingFill fill(s, ch, rows, warp, lane);
  int f = 0;  // stages filled (committed groups, empty ones included)
  // Rolled: the fill inlined once more instead of D - 1 times (each a ring_fill and the walk's
  // unit and chunk steps).
#pragma unroll 1
  for (int j = 0; j < D - 1; ++j) fill.fill(ring + (f++ % D) * kStage);
  constexpr int A = kMmaChains;
  float d[A][4];
#pragma unroll
  for (int a = 0; a < A; ++a) d[a][0] = d[a][1] = d[a][2] = d[a][3] = 0.0f;
  int st = 0;
  for (int i = 0; i < ch.count(); ++i) {
    const int slices = ch.slices(i), units = ch.blocks * slices, steps = ch.steps(i);
    const int64_t c = ch.column(i);
    const uint16_t* xs = act(i);
    for (int u = warp; u < units; u += warps) {
      int k0, k1;
      mma_unit_columns(u, ch.blocks, slices, steps, k0, k1);
      for (int k = k0; k < k1; k += kRingCols, ++st) {
        cp_async_wait<D - 2>();
        __syncwarp();  // every lane's copies of stage st landed; every lane read stage st - 1
        fill.fill(ring + (f++ % D) * kStage);
        const uint16_t* row = ring + (st % D) * kStage + g * kRingCols;
#pragma unroll
        for (int v = 0; v < kRingCols / 32; ++v) {
          const int kk = k + 32 * v;
          if (kk >= k1) break;  // the same for the whole warp
          const uint4 w = *reinterpret_cast<const uint4*>(row + ring_col(g, 32 * v + 8 * t));
          const uint4 lo = act8<M>(xs, stride, g, kk + 8 * t), hi = act8<M>(xs, stride, g + 8, kk + 8 * t);
          mma16816<BF16>(d[(2 * v) % A], lo.x, hi.x, lo.y, hi.y, w.x, w.y);
          mma16816<BF16>(d[(2 * v + 1) % A], lo.z, hi.z, lo.w, hi.w, w.z, w.w);
        }
      }
      // The unit's sums: d[·][2h + e] is activation row g + 8h, weight row r0 + 2t + e. Other
      // warps may add to the same sums (their own columns), hence the atomics.
      const int r0 = u % ch.blocks * 8;
#pragma unroll
      for (int e4 = 0; e4 < 4; ++e4) {
        float sum = 0.0f;
#pragma unroll
        for (int a = 0; a < A; ++a) {
          sum += d[a][e4];
          d[a][e4] = 0.0f;
        }
        const int m = g + 8 * (e4 >> 1), row = r0 + 2 * t + (e4 & 1);
        float* out;
        int32_t n;
        if (m < M && row < rows && weight_row(s, row, c, &out, &n)) atomicAdd(out + m * n, sum);
      }
    }
    leave(i);
  }
  cp_async_wait<0>();
  __syncwarp();  // the next use of the ring overwrites what this walk read last
}

// How many column slices mma_chunk cuts each block of 8 rows into (`steps` 32-column
// steps in all, U in flight per lane): as many busy warps as any cut gives, then the fewest
// rounds of loads for the busiest warp (its units times each unit's rounds of U steps), then
// the fewest slices. A batch-8 lm_head task of qwen3-0.6b (149 blocks of 1,024 columns) gets one
// slice (38 rounds of 16 loads), a one-block o-projection eight. Two other rules were retired
// (session 88): the fewest slices that give every warp the same number of units (the lm_head
// then took eight slices of four steps, 149 rounds: 226 against 102 us a task on the H200), and
// the fewest rounds alone (idle warps: whole models at batch 8 ran slower).
// Host-callable, so a CPU test runs it.
__host__ __device__ inline int mma_slices(int blocks, int warps, int steps, int U) {
  const int most = steps > 0 ? steps : 1;
  int best = 1, best_busy = 0, best_rounds = 0;
  // Unrolled where `warps` is a constant (mma_chunk's): the divisions by `slices` then are by
  // constants. Divisions by values cost tens of instructions each, ~1 us a task on the H200.
  MK_UNROLL
  for (int slices = 1; slices <= warps && slices <= most; ++slices) {
    const int units = blocks * slices, busy = units < warps ? units : warps;
    const int per_warp = (units + warps - 1) / warps;
    const int unit_steps = (steps + slices - 1) / slices;
    const int n = per_warp * ((unit_steps + U - 1) / U);
    if (slices == 1 || busy > best_busy || (busy == best_busy && n < best_rounds)) {
      best = slices;
      best_busy = busy;
      best_rounds = n;
    }
  }
  return best;
}

__device__ inline RingChunks::RingChunks(int64_t c0_, int64_t k_end, int kc_, int blocks_)
    : c0(c0_), kc(kc_), blocks(blocks_) {
  n = static_cast<int>((k_end - c0 + kc - 1) / kc);
  full_steps = kc / 32;
  last_steps = static_cast<int>(k_end - column(n - 1)) / 32;
  constexpr int warps = kCudaThreads / 32, u = kRingCols / 32;
  full_slices = mma_slices(blocks, warps, full_steps, u);
  last_slices = last_steps == full_steps ? full_slices : mma_slices(blocks, warps, last_steps, u);
}

// All warps on tensor cores over one staged chunk: (block of 8 rows, column slice) units, the
// slices cut by mma_slices; U steps' loads of the block in flight per lane. With D > 0 (weights
// from global memory) each warp streams all of its units through its D-stage ring at `ring`
// (mma_ring_walk).
template <int M, int U, int D = 0>
__device__ void mma_chunk(const StreamLinear& s, const uint16_t* xs, int stride, int kc, int64_t c,
                          int rows, uint16_t* ring = nullptr) {
  constexpr int warps = kCudaThreads / 32;  // every CTA of the megakernel
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int blocks = (rows + 7) / 8, steps = kc / 32;
  const bool bf16 = s.w_dtype == DTYPE_BF16;
  if constexpr (D > 0) {
    const RingChunks one(c, c + kc, kc, blocks);
    const auto act = [&](int) { return xs; };
    const auto leave = [](int) {};
    uint16_t* mine = ring + warp * D * (kRingStageBytes / 2);
    if (bf16) {
      mma_ring_walk<M, D, true>(s, one, stride, rows, mine, act, leave);
    } else {
      mma_ring_walk<M, D, false>(s, one, stride, rows, mine, act, leave);
    }
    return;
  }
  const int slices = mma_slices(blocks, warps, steps, U);
  for (int unit = warp; unit < blocks * slices; unit += warps) {
    const int rb = unit % blocks;
    int k0, k1;
    mma_unit_columns(unit, blocks, slices, steps, k0, k1);
    if (bf16) {
      mma_rows<M, U, true>(s, xs, stride, c, rb * 8, rows, k0, k1);
    } else {
      mma_rows<M, U, false>(s, xs, stride, c, rb * 8, rows, k0, k1);
    }
  }
}

// A warp's first unit of a chunk as mma_chunk cuts it (unit `warp`): false where the warp has
// none; else its first row r0 and columns [k0, k1).
__device__ inline bool mma_first_unit(int rows, int kc, int U, int& r0, int& k0, int& k1) {
  constexpr int warps = kCudaThreads / 32;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int blocks = (rows + 7) / 8, steps = kc / 32;
  const int slices = mma_slices(blocks, warps, steps, U);
  if (warp >= blocks * slices) return false;
  r0 = warp % blocks * 8;
  mma_unit_columns(warp, blocks, slices, steps, k0, k1);
  return true;
}

// The first E steps of the first round of the warp's first unit of chunk c (stream_linear's
// Bulk: issued behind the activation's bulk copies, so that their round trip overlaps the
// staging); mma_chunk_early then starts from them.
template <int U, int E>
__device__ inline void mma_first_round(const StreamLinear& s, int kc, int64_t c, int rows,
                                       uint4 (&w)[U]) {
  int r0, k0, k1;
  if (!mma_first_unit(rows, kc, U, r0, k0, k1)) return;
  mma_load<U, 0, E>(w, mma_row_pointer(s, c, r0, rows), k0, k1, static_cast<int>(threadIdx.x & 3u));
}

// mma_chunk (no ring, bf16 weights) where stream_linear's Bulk loads weights early: every
// unit inlined here (one copy of the product's code in the body), and with `early` (chunk 0)
// the warp's first unit starts from the E steps mma_first_round loaded.
template <int M, int U, int E>
__device__ void mma_chunk_early(const StreamLinear& s, const uint16_t* xs, int stride, int kc,
                                int64_t c, int rows, uint4 (&w)[U], bool early) {
  constexpr int warps = kCudaThreads / 32;
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int blocks = (rows + 7) / 8, steps = kc / 32;
  const int slices = mma_slices(blocks, warps, steps, U);
  for (int unit = warp; unit < blocks * slices; unit += warps) {
    int k0, k1;
    mma_unit_columns(unit, blocks, slices, steps, k0, k1);
    mma_rows_from<M, U, true, E>(s, xs, stride, c, unit % blocks * 8, rows, k0, k1, w,
                                    early && unit == warp);
  }
}

}  // namespace gpu
}  // namespace mk
