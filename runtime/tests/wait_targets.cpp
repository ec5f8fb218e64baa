// The GPU's wait targets across launches (mk/events.h): launches continue each other's counters,
// so targets grow past 2^32 and wrap; `reached` must still order a counter against its target.
// Prints "ok" or the first failed check.
#include <cstdint>
#include <cstdio>
#include <initializer_list>

#include "mk/events.h"

namespace {

int failures = 0;

void check(bool ok, const char* what, uint32_t a, uint32_t b) {
  if (!ok && failures++ == 0) std::printf("FAILED: %s (%u, %u)\n", what, a, b);
}

// One consumer's view of a counter with `count` signals per iteration, across launches of
// `iterations` iterations: the value after every producer of global iteration g has signalled.
uint32_t after(int32_t count, uint64_t g) { return static_cast<uint32_t>(count * (g + 1)); }

void one_launch(int32_t count, int32_t distance, int32_t iterations, uint32_t base) {
  for (int32_t t = 0; t < iterations; ++t) {
    const mk::WaitTarget w = mk::wait_target(count, distance, t, base);
    check(w.now == (t < distance), "now exactly for earlier launches' iterations", t, distance);
    if (w.now) continue;
    const uint64_t needed = static_cast<uint64_t>(base) + t - distance;  // the global iteration
    const uint32_t done = after(count, needed), short_one = done - 1;
    check(w.value == done, "target is the count after the awaited iteration", w.value, done);
    check(mk::reached(done, w.value), "the awaited count reaches it", done, w.value);
    check(!mk::reached(short_one, w.value), "one signal short does not", short_one, w.value);
    check(mk::reached(done + 3 * static_cast<uint32_t>(count), w.value),
          "a producer iterations ahead still reaches it", done, w.value);
    check(!mk::reached(done - 2 * static_cast<uint32_t>(count), w.value),
          "the iteration before does not", done, w.value);
  }
}

}  // namespace

int main() {
  const int32_t counts[] = {1, 3, 132, 4096};
  for (int32_t count : counts) {
    for (int32_t distance = 0; distance <= 2; ++distance) {
      one_launch(count, distance, 8, 0);       // the first launch after a reset
      one_launch(count, distance, 8, 8);       // the second
      // Launches whose counts cross 2^32 (and 2^31, where a signed compare would flip).
      for (uint64_t wrap : {uint64_t{1} << 31, uint64_t{1} << 32}) {
        const uint32_t base = static_cast<uint32_t>(wrap / count);
        for (uint32_t back = 0; back < 12; back += 3) one_launch(count, distance, 8, base - back);
      }
    }
  }
  check(mk::reached(5u, 0xFFFFFFFEu), "a counter that wrapped past its target", 5u, 0xFFFFFFFEu);
  check(!mk::reached(0xFFFFFFFEu, 5u), "a target that wrapped past the counter", 0xFFFFFFFEu, 5u);
  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}
