// The warp sums of mk/warp_sums.h on the CPU: 32 threads stand for a warp's lanes, exchanging
// through shared slots between barriers as __shfl_xor_sync does, on pseudo-random values; each
// total is checked against a sum in double. Prints "ok" or the first failed check.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include "mk/warp_sums.h"

namespace {

constexpr int kLanes = 32;
int failures = 0;

void check(bool ok, const char* what, int a, int b) {
  if (!ok && failures++ == 0) std::printf("FAILED: %s (%d, %d)\n", what, a, b);
}

// A value in [-1, 1) for (lane, j, m, salt): every lane knows every other lane's values, so the
// sums can be checked without another exchange.
float value(int lane, int j, int m, int salt) {
  uint32_t x = static_cast<uint32_t>(lane * 7919 + j * 104729 + m * 1299709 + salt * 15485863);
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return static_cast<float>(x % 65536u) / 32768.0f - 1.0f;
}

// One warp: slots and a barrier stand for the shuffle network.
struct Warp {
  float slot[kLanes] = {};
  std::barrier<> sync{kLanes};

  float exchange(int lane, float x, int d) {
    slot[lane] = x;
    sync.arrive_and_wait();
    const float got = slot[lane ^ d];
    sync.arrive_and_wait();
    return got;
  }
};

// group_sums<M, RG> in 32 lanes: each (j, m) written once, by one lane, with the lanes' total.
template <int M, int RG>
void check_group(int salt) {
  Warp warp;
  std::vector<std::atomic<int>> writes(RG * M);
  std::vector<float> totals(RG * M, 0.0f);
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < kLanes; ++lane) {
    lanes.emplace_back([&, lane] {
      float acc[RG][M];
      for (int j = 0; j < RG; ++j)
        for (int m = 0; m < M; ++m) acc[j][m] = value(lane, j, m, salt);
      const auto exchange = [&](float x, int d) { return warp.exchange(lane, x, d); };
      mk::gpu::group_sums<M, RG>(acc, lane, exchange, [&](int j, int m, float total) {
        // One writer per (j, m) if the reduction is right; counted atomically to catch two.
        writes[j * M + m].fetch_add(1);
        totals[j * M + m] = total;
      });
    });
  }
  for (std::thread& t : lanes) t.join();
  for (int j = 0; j < RG; ++j) {
    for (int m = 0; m < M; ++m) {
      double want = 0.0;
      for (int lane = 0; lane < kLanes; ++lane) want += value(lane, j, m, salt);
      check(writes[j * M + m] == 1, "each sum written by exactly one lane", RG * M, j * M + m);
      check(std::fabs(totals[j * M + m] - want) <= 1e-5 * (1.0 + std::fabs(want)),
            "a sum matches the lanes' values", RG * M, j * M + m);
    }
  }
}

// Every lane of a transposed index's group holds the same total: the index map is a partition.
template <int N>
void check_index_map() {
  std::vector<int> seen(N, 0);
  for (int lane = 0; lane < kLanes; ++lane) {
    const int index = mk::gpu::transposed_index<N>(lane);
    check(index >= 0 && index < N, "an index in range", N, index);
    if (index >= 0 && index < N) ++seen[index];
  }
  for (int i = 0; i < N; ++i) check(seen[i] == kLanes / N, "each index in 32 / N lanes", N, i);
}

}  // namespace

int main() {
  // N = 1, 2, 4, ..., 32.
  []<int... P>(std::integer_sequence<int, P...>) {
    (check_index_map<1 << P>(), ...);
  }(std::make_integer_sequence<int, 6>{});
  // The row groups the decode linears take (RG 1..8 rows of 1..16 activation rows), padded
  // counts (3 · 4 = 12 -> 16, 6 · 1 -> 8), all 32, and past 32 (five exchanges a value).
  check_group<1, 1>(1);
  check_group<1, 2>(2);
  check_group<1, 4>(3);
  check_group<1, 6>(4);
  check_group<1, 8>(5);
  check_group<3, 4>(6);
  check_group<5, 2>(7);
  check_group<2, 8>(8);
  check_group<4, 8>(9);
  check_group<16, 2>(10);
  check_group<16, 4>(11);
  check_group<8, 8>(12);
  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}
