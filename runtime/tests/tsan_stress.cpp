// Stress driver for the CPU executor, built with -fsanitize=thread by test_cpu_executor.py.
//
// Runs a random float32 ADD dataflow graph (tiled buffers in one arena, loop-carried "free" waits)
// and a TRACE graph on 8 threads with random delays, checks the numbers against a sequential
// reference, and checks that a throwing kind and a missing signal become errors, not hangs.
// Exit code 0 and "ok" on stdout when every check passed. Built with MK_EVENTS_BROKEN_RELAXED it
// is expected to make ThreadSanitizer report races (proof that the clean run means something).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_executor.h"

namespace {

constexpr int kTile = 64;
constexpr int kTiles = 4;
constexpr int kLen = kTile * kTiles;
constexpr int kInputs = 3;
constexpr int kBuffers = 14;  // the last one accumulates: acc = acc + previous buffer
constexpr int kIterations = 3;

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  }
}

struct AddGraph {
  mk::Tables tables;
  std::vector<int> src_a, src_b;  // per buffer, its operands (computed buffers only)
};

int task_of(int buffer, int tile) { return (buffer - kInputs) * kTiles + tile; }

// Buffer k >= kInputs is src_a[k] + src_b[k], tile by tile; each tile task has its own counter.
AddGraph make_add_graph(std::mt19937& rng, int num_sms) {
  AddGraph g;
  g.src_a.assign(kBuffers, -1);
  g.src_b.assign(kBuffers, -1);
  for (int k = kInputs; k < kBuffers - 1; ++k) {
    g.src_a[k] = static_cast<int>(rng() % k);
    g.src_b[k] = static_cast<int>(rng() % k);
  }
  g.src_a[kBuffers - 1] = kBuffers - 1;
  g.src_b[kBuffers - 1] = kBuffers - 2;
  mk::Tables& t = g.tables;
  for (int b = 0; b < kBuffers; ++b) {
    mk::BufferDesc d{};
    d.offset_or_ptr = static_cast<uint64_t>(b) * kLen * 4;
    d.bytes = kLen * 4;
    d.dtype = mk::DTYPE_F32;
    d.rank = 1;
    d.kind = mk::BUF_ACTIVATION;
    d.shape[0] = kLen;
    t.buffers.push_back(d);
  }
  t.arena_bytes = static_cast<uint64_t>(kBuffers) * kLen * 4;
  std::vector<std::vector<int>> queues(num_sms);
  for (int k = kInputs; k < kBuffers; ++k) {
    for (int tile = 0; tile < kTiles; ++tile) {
      mk::TaskDesc d{};
      d.kind = mk::KIND_ADD;
      d.grid = k;
      d.coord[0] = tile;
      d.args[mk::ADD_DST] = k;
      d.args[mk::ADD_A] = g.src_a[k];
      d.args[mk::ADD_B] = g.src_b[k];
      d.args[mk::ADD_BEGIN] = tile * kTile;
      d.args[mk::ADD_END] = (tile + 1) * kTile;
      d.wait_begin = static_cast<int32_t>(t.waits.size());
      for (int src : {g.src_a[k], g.src_b[k]})  // read after write, same iteration
        if (src >= kInputs && src != k) t.waits.push_back({task_of(src, tile), 1, 0});
      for (int reader = k + 1; reader < kBuffers; ++reader)  // write after read, previous iteration
        if (g.src_a[reader] == k || g.src_b[reader] == k) t.waits.push_back({task_of(reader, tile), 1, 1});
      d.wait_end = static_cast<int32_t>(t.waits.size());
      d.signal_begin = static_cast<int32_t>(t.signals.size());
      t.signals.push_back({task_of(k, tile)});
      d.signal_end = static_cast<int32_t>(t.signals.size());
      queues[rng() % num_sms].push_back(static_cast<int>(t.tasks.size()));
      t.tasks.push_back(d);
    }
  }
  t.num_counters = static_cast<int32_t>(t.tasks.size());
  t.iterations = kIterations;
  t.queue_offsets.push_back(0);
  for (const auto& q : queues) {
    t.queue_tasks.insert(t.queue_tasks.end(), q.begin(), q.end());
    t.queue_offsets.push_back(static_cast<int32_t>(t.queue_tasks.size()));
  }
  return g;
}

void run_add_graph(uint32_t seed, int num_sms, int threads) {
  std::mt19937 rng(seed);
  AddGraph g = make_add_graph(rng, num_sms);
  std::vector<float> arena(static_cast<size_t>(kBuffers) * kLen, 0.0f);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int i = 0; i < kInputs * kLen; ++i) arena[i] = value(rng);
  for (int i = 0; i < kLen; ++i) arena[(kBuffers - 1) * kLen + i] = value(rng);
  std::vector<float> expected = arena;
  for (int it = 0; it < kIterations; ++it)
    for (int k = kInputs; k < kBuffers; ++k)
      for (int i = 0; i < kLen; ++i)
        expected[k * kLen + i] = expected[g.src_a[k] * kLen + i] + expected[g.src_b[k] * kLen + i];
  mk::CpuExecutor exec(g.tables);
  mk::RunOptions opt;
  opt.num_threads = threads;
  opt.max_delay_us = 30;
  opt.seed = seed;
  exec.run(exec.bind({}, arena.data(), arena.size() * 4), opt);
  expect(std::memcmp(arena.data(), expected.data(), arena.size() * 4) == 0,
         "add graph differs from the sequential reference (seed " + std::to_string(seed) + ")");
}

mk::Tables chain_tables(int length, int num_sms, int iterations, bool drop_last_signal) {
  mk::Tables t;
  t.queue_offsets.assign(1, 0);
  for (int i = 0; i < length; ++i) {
    mk::TaskDesc d{};
    d.kind = mk::KIND_TRACE;
    d.wait_begin = static_cast<int32_t>(t.waits.size());
    if (i > 0) t.waits.push_back({i - 1, 1, 0});
    d.wait_end = static_cast<int32_t>(t.waits.size());
    d.signal_begin = static_cast<int32_t>(t.signals.size());
    if (!(drop_last_signal && i == length - 2)) t.signals.push_back({i});
    d.signal_end = static_cast<int32_t>(t.signals.size());
    t.tasks.push_back(d);
  }
  for (int sm = 0; sm < num_sms; ++sm) {
    for (int i = sm; i < length; i += num_sms) t.queue_tasks.push_back(i);
    t.queue_offsets.push_back(static_cast<int32_t>(t.queue_tasks.size()));
  }
  t.num_counters = length;
  t.iterations = iterations;
  return t;
}

void run_trace_chain(int threads) {
  mk::CpuExecutor exec(chain_tables(40, 16, 2, false));
  mk::RunOptions opt;
  opt.num_threads = threads;
  opt.max_delay_us = 20;
  mk::RunResult r = exec.run({}, opt);
  bool ordered = true;
  for (int it = 0; it < 2; ++it)
    for (int i = 1; i < 40; ++i)
      ordered = ordered && r.trace[(it * 40 + i - 1) * 2 + 1] < r.trace[(it * 40 + i) * 2];
  expect(ordered, "trace chain out of order with " + std::to_string(threads) + " threads");
}

void run_failures() {
  mk::register_kind(mk::KIND_FIRST_LOWERED, "throws", [](const mk::TaskDesc&, mk::ExecContext& ctx) {
    if (ctx.task == 5) throw std::runtime_error("boom");
  });
  mk::Tables t = chain_tables(12, 4, 2, false);
  for (auto& d : t.tasks) d.kind = mk::KIND_FIRST_LOWERED;
  mk::RunOptions opt;
  opt.num_threads = 8;
  try {
    mk::CpuExecutor(t).run({}, opt);
    expect(false, "a throwing kind did not fail the run");
  } catch (const std::runtime_error& e) {
    expect(std::string(e.what()).find("task 5") != std::string::npos && std::string(e.what()).find("boom") != std::string::npos,
           std::string("kernel failure message: ") + e.what());
  }
  opt.timeout_ms = 100;
  try {  // one iteration, so that only SM 3 is stuck when the watchdog fires
    mk::CpuExecutor(chain_tables(12, 4, 1, true)).run({}, opt);
    expect(false, "a missing signal did not trip the watchdog");
  } catch (const mk::DeadlockError& e) {
    expect(e.status.task == 11 && e.status.counter == 10 && e.status.sm == 3,
           std::string("watchdog status: ") + e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const uint32_t seeds = argc > 1 ? static_cast<uint32_t>(std::atoi(argv[1])) : 3;
  for (uint32_t seed = 1; seed <= seeds; ++seed) run_add_graph(seed, 16, 8);
  run_add_graph(99, 5, 8);  // more threads than SMs
  run_trace_chain(3);       // several SMs per thread
  run_trace_chain(8);
  run_failures();
  if (failures != 0) return 1;
  std::printf("ok\n");
  return 0;
}
