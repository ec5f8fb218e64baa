// Sums of several values over a warp's 32 lanes, reduced transposed. The lane exchange is passed
// in (on the GPU __shfl_xor_sync), so the CPU tests run this same code with threads as lanes
// (runtime/tests/warp_sums.cpp).
#pragma once

#include "mk/tables.h"

namespace mk {
namespace gpu {

// The next power of two at or above v, at most 32.
MK_HOST_DEVICE constexpr int pow2_at_least(int v) {
  return v <= 1 ? 1 : v <= 2 ? 2 : v <= 4 ? 4 : v <= 8 ? 8 : v <= 16 ? 16 : 32;
}

// Each of N values summed over the warp, transposed: at the step of lane distance d, the lanes
// with bit d set keep the upper half of the values still apart and send the lower half, so the
// values halve as they go (N - 1 exchanges while more than one is apart, then one a step)
// instead of five exchanges a value. Returns `lane`'s total: that of value
// transposed_index<N>(lane), the same in every lane of its group of 32 / N. `exchange(x, d)`
// returns the x of lane ^ d, every lane taking part. N: a power of two of at most 32.
template <int N, class Exchange>
MK_HOST_DEVICE inline float warp_sums_transposed(float (&v)[N], int lane, Exchange&& exchange) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "N: a power of two, at most 32");
  int n = N;
  MK_UNROLL
  for (int d = 16; d > 0; d >>= 1) {
    if (n > 1) {
      const int half = n / 2;
      const bool upper = (lane & d) != 0;
      MK_UNROLL
      for (int i = 0; i < half; ++i) {
        const float send = upper ? v[i] : v[i + half];
        const float keep = upper ? v[i + half] : v[i];
        v[i] = keep + exchange(send, d);
      }
      n = half;
    } else {
      v[0] += exchange(v[0], d);
    }
  }
  return v[0];
}

// Which value's total warp_sums_transposed<N> leaves in `lane`.
template <int N>
MK_HOST_DEVICE inline int transposed_index(int lane) {
  int index = 0, n = N;
  MK_UNROLL
  for (int d = 16; d > 0; d >>= 1) {
    if (n > 1) {
      n /= 2;
      if (lane & d) index += n;
    }
  }
  return index;
}

// acc[j][m] summed over the warp; write(j, m, total) runs once for each (j, m), in one lane.
// Transposed up to 32 values (padded with zeros to a power of two), else five exchanges a value
// and lane 0 writes.
template <int M, int RG, class Exchange, class Write>
MK_HOST_DEVICE inline void group_sums(const float (&acc)[RG][M], int lane, Exchange&& exchange,
                                      Write&& write) {
  if constexpr (RG * M > 32) {
    MK_UNROLL
    for (int j = 0; j < RG; ++j) {
      MK_UNROLL
      for (int m = 0; m < M; ++m) {
        float v = acc[j][m];
        MK_UNROLL
        for (int d = 16; d > 0; d >>= 1) v += exchange(v, d);
        if (lane == 0) write(j, m, v);
      }
    }
  } else {
    constexpr int N = pow2_at_least(RG * M);
    float v[N];
    MK_UNROLL
    for (int i = 0; i < N; ++i) v[i] = i < RG * M ? acc[i / M][i % M] : 0.0f;
    const float total = warp_sums_transposed<N>(v, lane, exchange);
    const int index = transposed_index<N>(lane);
    if ((lane & (32 / N - 1)) == 0 && index < RG * M) write(index / M, index % M, total);
  }
}

}  // namespace gpu
}  // namespace mk
