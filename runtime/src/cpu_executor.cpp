// The CPU executor: kernel libraries and the SM-playing worker threads that run the tables.
#include "cpu_executor.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <dlfcn.h>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>

#include "cpu_internal.h"
#include "mk/version.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MK_CPU_RELAX() _mm_pause()
#else
#define MK_CPU_RELAX() ((void)0)
#endif

namespace mk {

// ------------------------------------------------------------------ kernel libraries

namespace {

void* library_symbol(void* handle, const std::string& path, const char* name) {
  dlerror();  // clears a stale error so that a null symbol is told apart from a missing one
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    const char* why = dlerror();
    dlclose(handle);
    throw std::runtime_error(cat("kernel library ", path, " does not export '", name,
                                 "'", why ? cat(": ", why) : std::string()));
  }
  return sym;
}

}  // namespace

KernelLibrary::KernelLibrary(const std::string& path) : path_(path) {
  // RTLD_LOCAL: two programs' libraries export the same names and must not resolve to each other.
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(cat("cannot load kernel library ", path, ": ", why ? why : "unknown error"));
  }
  auto abi = reinterpret_cast<AbiFn>(library_symbol(handle_, path, "mk_abi_version"));
  auto num_kinds = reinterpret_cast<AbiFn>(library_symbol(handle_, path, "mk_num_kinds"));
  kind_name_ = reinterpret_cast<KindNameFn>(library_symbol(handle_, path, "mk_kind_name"));
  dispatch_ = reinterpret_cast<DispatchFn>(library_symbol(handle_, path, "mk_dispatch"));
  last_error_ = reinterpret_cast<LastErrorFn>(library_symbol(handle_, path, "mk_last_error"));
  abi_ = abi();
  num_kinds_ = num_kinds();
  if (abi_ != MK_RUNTIME_ABI || num_kinds_ < 0) {
    dlclose(handle_);
    throw std::runtime_error(cat("kernel library ", path, " was built for runtime ABI ", abi_,
                                 " with ", num_kinds_, " kinds; this runtime has ABI ", MK_RUNTIME_ABI,
                                 " (recompile the program)"));
  }
}

KernelLibrary::~KernelLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string KernelLibrary::kind_name(int32_t kind) const {
  if (kind < KIND_FIRST_LOWERED || kind - KIND_FIRST_LOWERED >= num_kinds_) return {};
  const char* name = kind_name_(kind);
  return name ? name : "";
}

void KernelLibrary::dispatch(const TaskDesc& task, void* const* buffers, int32_t iteration) const {
  const int32_t code = dispatch_(task.kind, &task, buffers, iteration);
  if (code == 0) return;
  const char* why = last_error_();  // thread-local in the library: this thread's last failure
  throw std::runtime_error(cat("kernel '", kind_name(task.kind), "' (kind ", task.kind, ") returned ",
                               code, ": ", why ? why : "no message"));
}

// ------------------------------------------------------------------ executor construction

CpuExecutor::CpuExecutor(Tables tables, std::shared_ptr<const KernelLibrary> library)
    : tables_(std::move(tables)), library_(std::move(library)) {
  validate_tables(tables_);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  for (size_t i = 0; i < tables_.tasks.size(); ++i) {
    const TaskDesc& d = tables_.tasks[i];
    if (library_ && d.kind >= KIND_FIRST_LOWERED) {
      if (d.kind - KIND_FIRST_LOWERED >= library_->num_kinds())
        table_error("tasks", i, cat("kind ", d.kind, " is not in kernel library ", library_->path(),
                                    " (kinds ", KIND_FIRST_LOWERED, "..",
                                    KIND_FIRST_LOWERED + library_->num_kinds() - 1, ")"));
      if (static_cast<size_t>(d.kind) >= kinds_.size()) kinds_.resize(d.kind + 1);
      const KernelLibrary* lib = library_.get();  // kept alive by library_ as long as kinds_
      kinds_[d.kind] = [lib](const TaskDesc& t, ExecContext& ctx) { lib->dispatch(t, ctx.buffers, ctx.iteration); };
      continue;
    }
    auto found = reg.kinds.find(d.kind);
    if (found == reg.kinds.end()) table_error("tasks", i, cat("kind ", d.kind, " is not registered"));
    if (found->second.check) {
      std::string problem = found->second.check(d, tables_.buffers);
      if (!problem.empty()) table_error("tasks", i, problem);
    }
    if (static_cast<size_t>(d.kind) >= kinds_.size()) kinds_.resize(d.kind + 1);
    kinds_[d.kind] = found->second.run;
    traced_ = traced_ || d.kind == KIND_TRACE;
  }
}

std::vector<void*> CpuExecutor::bind(const std::vector<BufferBinding>& bindings, void* arena,
                                     uint64_t arena_bytes) const {
  const auto& descs = tables_.buffers;
  if (!bindings.empty() && bindings.size() != descs.size())
    throw TableError(cat("buffers: got ", bindings.size(), " for ", descs.size(), " buffer rows"));
  std::vector<void*> out(descs.size(), nullptr);
  for (size_t i = 0; i < descs.size(); ++i) {
    const BufferDesc& d = descs[i];
    if (!bindings.empty() && bindings[i].data != nullptr) {
      if (bindings[i].bytes < d.bytes)
        table_error("buffers", i, cat("bound ", bindings[i].bytes, " bytes, needs ", d.bytes));
      out[i] = bindings[i].data;
      continue;
    }
    if (arena == nullptr) table_error("buffers", i, "is not bound and there is no arena");
    if (d.offset_or_ptr > arena_bytes || d.bytes > arena_bytes - d.offset_or_ptr)
      table_error("buffers", i, cat("arena range ", d.offset_or_ptr, " + ", d.bytes,
                                    " exceeds the given arena of ", arena_bytes, " bytes"));
    out[i] = static_cast<char*>(arena) + d.offset_or_ptr;
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

// The progress of one SM through its queue, written only by the worker thread that plays it
// (read by the others only after join). Aligned so neighbours do not share a cache line.
// A tail task an SM owes: its signal completed the tail's event element in `iteration`.
struct TailRun {
  int32_t task;
  int32_t iteration;
};

struct alignas(64) SmState {
  int32_t sm = 0;
  std::vector<TailRun> tails;  // owed tails, run (last first) before the queue goes on
  int32_t begin = 0, end = 0;  // its slice of queue_tasks
  int32_t pos = 0;             // next queue slot
  int32_t iteration = 0;
  int32_t wait_row = -1;       // first wait of the next task not yet seen satisfied
  bool done = false;
  Clock::time_point blocked_since{};
  bool blocked = false;
  int32_t blocked_counter = -1;
  uint32_t blocked_value = 0;
  int64_t blocked_threshold = 0;
};

// Everything one launch shares between its worker threads.
class Launch {
 public:
  Launch(const Tables& t, const std::vector<KindFn>& kinds, const std::vector<void*>& buffers,
         const RunOptions& opt, int32_t iterations, bool traced)
      : t_(t), kinds_(kinds), buffers_(buffers), opt_(opt), iterations_(iterations),
        counters_(new Counter[t.num_counters > 0 ? t.num_counters : 1]),
        sms_(t.queue_offsets.size() - 1) {
    for (int32_t c = 0; c < t.num_counters; ++c) counters_[c].store(0, std::memory_order_relaxed);
    for (size_t sm = 0; sm < sms_.size(); ++sm) {
      SmState& s = sms_[sm];
      s.sm = static_cast<int32_t>(sm);
      s.begin = s.pos = t.queue_offsets[sm];
      s.end = t.queue_offsets[sm + 1];
      s.done = s.begin == s.end;
    }
    if (traced) trace_.assign(static_cast<size_t>(iterations) * t.tasks.size() * 2, -1);
  }

  void worker(int32_t thread, int32_t num_threads);
  void finish();  // after join: throws the first error, if any
  void abort() { stop_.store(true, std::memory_order_release); }
  std::vector<int64_t> take_trace() { return std::move(trace_); }

 private:
  bool step(SmState& s, ExecContext& ctx, std::mt19937_64& rng);
  void check_watchdog(const std::vector<SmState*>& mine, Clock::time_point now);
  const SmState* oldest_blocked() const;
  void fail(const RunStatus& status, std::string message);
  void delay(std::mt19937_64& rng, int one_in);
  int64_t since_start() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  }

  const Tables& t_;
  const std::vector<KindFn>& kinds_;
  const std::vector<void*>& buffers_;
  const RunOptions& opt_;
  const int32_t iterations_;
  std::unique_ptr<Counter[]> counters_;
  std::vector<SmState> sms_;
  std::vector<int64_t> trace_;
  const Clock::time_point start_ = Clock::now();  // the timeline's zero
  std::atomic<int64_t> clock_{0};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  RunStatus status_{};
  // A failed task's message, copied out of its exception in the worker that caught it: no
  // exception object outlives the worker's handler.
  std::string message_;
};

void Launch::delay(std::mt19937_64& rng, int one_in) {
  if (opt_.max_delay_us <= 0 || rng() % one_in != 0) return;
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % (opt_.max_delay_us + 1)));
}

// The task an SM runs next: its last owed tail, else its queue's next.
TailRun next_task(const Tables& t, const SmState& s) {
  return s.tails.empty() ? TailRun{t.queue_tasks[s.pos], s.iteration} : s.tails.back();
}

// Runs the SM's next task if all its waits are satisfied; never blocks.
bool Launch::step(SmState& s, ExecContext& ctx, std::mt19937_64& rng) {
  const bool tail = !s.tails.empty();
  const auto [task, iteration] = next_task(t_, s);
  const TaskDesc& d = t_.tasks[task];
  if (s.wait_row < 0) s.wait_row = d.wait_begin;
  // Satisfied waits stay satisfied (counters only grow), so a retry resumes at the blocker.
  for (; s.wait_row < d.wait_end; ++s.wait_row) {
    const WaitDesc& w = t_.waits[s.wait_row];
    const int64_t threshold = wait_threshold(w.count, w.distance, iteration);
    uint32_t seen = 0;
    if (event_ready(counters_[w.counter], threshold, &seen)) continue;
    if (!s.blocked) s.blocked_since = Clock::now();
    s.blocked = true;
    s.blocked_counter = w.counter;
    s.blocked_value = seen;
    s.blocked_threshold = threshold;
    return false;
  }
  s.blocked = false;
  delay(rng, 2);
  ctx.task = task;
  ctx.sm = s.sm;
  ctx.iteration = iteration;
  // Each (iteration, task) runs once, on one worker: its two stamps are that worker's alone.
  int64_t* stamps = opt_.timeline ? opt_.timeline + (static_cast<int64_t>(iteration) * t_.tasks.size() + task) * 2 : nullptr;
  if (stamps) stamps[0] = since_start();
  try {
    kinds_[d.kind](d, ctx);
  } catch (const std::exception& e) {
    fail(RunStatus{RUN_KERNEL_FAILED, s.sm, task, -1, iteration, 0, 0, 0}, e.what());
    return false;
  } catch (...) {
    fail(RunStatus{RUN_KERNEL_FAILED, s.sm, task, -1, iteration, 0, 0, 0}, "a non-standard exception");
    return false;
  }
  if (stamps) stamps[1] = since_start();
  delay(rng, 4);
  if (tail) s.tails.pop_back();
  for (int32_t r = d.signal_begin; r < d.signal_end; ++r) {
    const SignalDesc& sig = t_.signals[r];
    if (sig.tail < 0) {
      event_signal(counters_[sig.counter]);
    } else if (completes_element(event_signal_tail(counters_[sig.counter]), sig.count, iteration)) {
      s.tails.push_back(TailRun{sig.tail, iteration});
    }
  }
  s.wait_row = -1;
  if (!tail && ++s.pos == s.end) {
    s.pos = s.begin;
    ++s.iteration;
  }
  s.done = s.iteration == iterations_ && s.tails.empty();
  return true;
}

void Launch::fail(const RunStatus& status, std::string message) {
  std::lock_guard<std::mutex> lock(error_mutex_);
  if (status_.error == RUN_OK) {
    status_ = status;
    message_ = std::move(message);
  }
  stop_.store(true, std::memory_order_release);
}

void Launch::check_watchdog(const std::vector<SmState*>& mine, Clock::time_point now) {
  if (opt_.timeout_ms <= 0) return;
  const auto limit = std::chrono::milliseconds(opt_.timeout_ms);
  for (const SmState* s : mine) {
    if (s->done || !s->blocked || now - s->blocked_since <= limit) continue;
    // Which SM is reported is settled after join (the oldest wait), so only the kind matters.
    const TailRun next = next_task(t_, *s);
    fail(RunStatus{RUN_TIMEOUT, s->sm, next.task, s->blocked_counter, next.iteration, 0, 0, 0}, {});
    return;
  }
}

// The SM that has waited longest: on a stuck launch, the nearest to the root cause (SMs that
// wait on its queue block later). Only called after the workers joined.
const SmState* Launch::oldest_blocked() const {
  const SmState* oldest = nullptr;
  for (const SmState& s : sms_)
    if (!s.done && s.blocked && (oldest == nullptr || s.blocked_since < oldest->blocked_since)) oldest = &s;
  return oldest;
}

void Launch::worker(int32_t thread, int32_t num_threads) {
  std::vector<SmState*> mine;
  for (size_t sm = thread; sm < sms_.size(); sm += num_threads) mine.push_back(&sms_[sm]);
  ExecContext ctx;
  ctx.thread = thread;
  ctx.num_tasks = static_cast<int32_t>(t_.tasks.size());
  ctx.num_buffers = static_cast<int32_t>(t_.buffers.size());
  ctx.buffers = buffers_.data();
  ctx.buffer_descs = t_.buffers.data();
  ctx.trace = trace_.empty() ? nullptr : trace_.data();
  ctx.clock = &clock_;
  std::mt19937_64 rng(opt_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(thread) + 1);
  uint32_t idle_rounds = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    bool progressed = false, all_done = true;
    // Poll every owned SM: one blocked SM never stalls another that shares this thread.
    for (SmState* s : mine) {
      while (!s->done && !stop_.load(std::memory_order_relaxed) && step(*s, ctx, rng)) progressed = true;
      all_done = all_done && s->done;
    }
    if (all_done) return;
    if (progressed) {
      idle_rounds = 0;
      continue;
    }
    ++idle_rounds;
    if (idle_rounds < 64) {
      MK_CPU_RELAX();
    } else if (idle_rounds < 256) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (idle_rounds % 32 == 0 || idle_rounds >= 256) check_watchdog(mine, Clock::now());
  }
}

void Launch::finish() {
  if (status_.error == RUN_OK) return;
  const SmState* oldest = oldest_blocked();  // at least the SM whose watchdog fired
  if (status_.error == RUN_TIMEOUT && oldest != nullptr) {
    const SmState& s = *oldest;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - s.blocked_since);
    const TailRun next = next_task(t_, s);
    status_ = RunStatus{RUN_TIMEOUT,       s.sm,           next.task,
                        s.blocked_counter, next.iteration, s.blocked_value,
                        static_cast<uint32_t>(s.blocked_threshold), static_cast<int32_t>(waited.count())};
  }
  const RunStatus& st = status_;
  const TaskDesc& d = t_.tasks[st.task];
  const std::string where = cat("task ", st.task, " (kind ", d.kind, ", grid ", d.grid, ", coord ",
                                coord_text(d), ") on SM ", st.sm, " in iteration ", st.iteration);
  if (st.error == RUN_KERNEL_FAILED) throw std::runtime_error(cat(where, " failed: ", message_));
  throw DeadlockError(cat("watchdog: ", where, " waited ", st.wait_ms, " ms on event counter ",
                          st.counter, ": value ", st.value, ", threshold ", st.threshold,
                          " (a missing signal, a wait cycle or a queue order against the waits)"),
                      st);
}

}  // namespace

RunResult CpuExecutor::run(const std::vector<void*>& buffers, const RunOptions& options) const {
  if (buffers.size() != tables_.buffers.size())
    throw TableError(cat("buffers: got ", buffers.size(), " addresses for ", tables_.buffers.size(), " rows"));
  if (options.num_threads < 1 || options.num_threads > MAX_THREADS)
    throw TableError(cat("num_threads ", options.num_threads, " outside 1..", MAX_THREADS));
  if (options.max_delay_us < 0) throw TableError("max_delay_us is negative");
  const int32_t iterations = options.iterations > 0 ? options.iterations : tables_.iterations;
  for (size_t i = 0; i < tables_.waits.size(); ++i)
    if (wait_threshold(tables_.waits[i].count, 0, iterations - 1) > UINT32_MAX)
      table_error("waits", i, cat("count ", tables_.waits[i].count, " over ", iterations,
                                  " iterations overflows a 32-bit counter"));
  const int32_t num_sms = static_cast<int32_t>(tables_.queue_offsets.size()) - 1;
  const int32_t threads = std::min(options.num_threads, num_sms);
  Launch launch(tables_, kinds_, buffers, options, iterations, traced_);
  std::vector<std::thread> workers;
  workers.reserve(threads);
  try {
    for (int32_t i = 0; i < threads; ++i)
      workers.emplace_back([&launch, i, threads] { launch.worker(i, threads); });
  } catch (...) {
    // Threads already started must be stopped and joined before the error leaves this frame.
    launch.abort();
    for (std::thread& w : workers) w.join();
    throw;
  }
  for (std::thread& w : workers) w.join();
  launch.finish();
  RunResult result;
  result.iterations = iterations;
  result.threads = threads;
  result.trace = launch.take_trace();
  return result;
}

}  // namespace mk
