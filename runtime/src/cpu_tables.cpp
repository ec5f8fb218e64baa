// The CPU runtime's tables: the task-kind registry with its built-in kinds, and the validation
// of a program's tables before any executor runs them.
#include <climits>
#include <map>
#include <mutex>
#include <string>

#include "cpu_executor.h"
#include "cpu_internal.h"
#include "mk/version.h"

namespace mk {

[[noreturn]] void table_error(const std::string& table, int64_t index, const std::string& what) {
  throw TableError(cat(table, "[", index, "]: ", what));
}

std::string coord_text(const TaskDesc& t) {
  return cat("[", t.coord[0], ", ", t.coord[1], ", ", t.coord[2], "]");
}

namespace {

// ------------------------------------------------------------------ built-in kinds

void run_nop(const TaskDesc&, ExecContext&) {}

void run_trace(const TaskDesc&, ExecContext& ctx) {
  int64_t* slot = ctx.trace + (static_cast<int64_t>(ctx.iteration) * ctx.num_tasks + ctx.task) * 2;
  slot[0] = ctx.tick();
  slot[1] = ctx.tick();
}

void run_add(const TaskDesc& t, ExecContext& ctx) {
  float* dst = ctx.buffer<float>(t.args[ADD_DST]);
  const float* a = ctx.buffer<float>(t.args[ADD_A]);
  const float* b = ctx.buffer<float>(t.args[ADD_B]);
  for (int32_t i = t.args[ADD_BEGIN]; i < t.args[ADD_END]; ++i) dst[i] = a[i] + b[i];
}

std::string check_add(const TaskDesc& t, const std::vector<BufferDesc>& buffers) {
  const int32_t begin = t.args[ADD_BEGIN], end = t.args[ADD_END];
  if (begin < 0 || end < begin) return cat("add range [", begin, ", ", end, ") is invalid");
  for (int arg : {ADD_DST, ADD_A, ADD_B}) {
    const int32_t b = t.args[arg];
    if (b < 0 || b >= static_cast<int32_t>(buffers.size()))
      return cat("add arg ", arg, " names buffer ", b, " of ", buffers.size());
    if (buffers[b].dtype != DTYPE_F32) return cat("add buffer ", b, " is not float32");
    if (static_cast<uint64_t>(end) * 4 > buffers[b].bytes)
      return cat("add range end ", end, " exceeds buffer ", b, " (", buffers[b].bytes, " bytes)");
  }
  return {};
}

// ------------------------------------------------------------------ validation

void validate_tasks(const Tables& t) {
  const int64_t nw = static_cast<int64_t>(t.waits.size());
  const int64_t ns = static_cast<int64_t>(t.signals.size());
  for (size_t i = 0; i < t.tasks.size(); ++i) {
    const TaskDesc& d = t.tasks[i];
    if (d.wait_begin < 0 || d.wait_end < d.wait_begin || d.wait_end > nw)
      table_error("tasks", i, cat("wait rows [", d.wait_begin, ", ", d.wait_end, ") outside 0..", nw));
    if (d.signal_begin < 0 || d.signal_end < d.signal_begin || d.signal_end > ns)
      table_error("tasks", i,
                  cat("signal rows [", d.signal_begin, ", ", d.signal_end, ") outside 0..", ns));
  }
  for (size_t i = 0; i < t.waits.size(); ++i) {
    const WaitDesc& w = t.waits[i];
    if (w.counter < 0 || w.counter >= t.num_counters)
      table_error("waits", i, cat("counter ", w.counter, " outside 0..", t.num_counters));
    if (w.count < 1) table_error("waits", i, cat("count ", w.count, " is not positive"));
    if (w.distance < 0) table_error("waits", i, cat("distance ", w.distance, " is negative"));
  }
  // Every signal row of a counter names the same tail and count.
  std::vector<const SignalDesc*> first(t.num_counters > 0 ? t.num_counters : 0, nullptr);
  for (size_t i = 0; i < t.signals.size(); ++i) {
    const SignalDesc& sig = t.signals[i];
    const int32_t c = sig.counter;
    if (c < 0 || c >= t.num_counters)
      table_error("signals", i, cat("counter ", c, " outside 0..", t.num_counters));
    if (sig.tail < -1 || sig.tail >= static_cast<int32_t>(t.tasks.size()))
      table_error("signals", i, cat("tail ", sig.tail, " outside -1..", t.tasks.size() - 1));
    if (sig.tail >= 0 && sig.count < 1)
      table_error("signals", i, cat("count ", sig.count, " of a tail is not positive"));
    if (first[c] == nullptr) {
      first[c] = &sig;
    } else if (first[c]->tail != sig.tail || (sig.tail >= 0 && first[c]->count != sig.count)) {
      table_error("signals", i, cat("counter ", c, " has tail ", sig.tail, " here and ", first[c]->tail,
                                    " in another row"));
    }
  }
}

// The task each tail row names, marked (a tail is in no queue).
std::vector<bool> tail_tasks(const Tables& t) {
  std::vector<bool> tail(t.tasks.size(), false);
  for (const SignalDesc& sig : t.signals)
    if (sig.tail >= 0) tail[sig.tail] = true;
  return tail;
}

void validate_queues(const Tables& t) {
  const auto& off = t.queue_offsets;
  if (off.size() < 2) table_error("queue_offsets", 0, "needs num_sms + 1 >= 2 entries");
  if (off[0] != 0) table_error("queue_offsets", 0, cat("is ", off[0], ", not 0"));
  for (size_t s = 1; s < off.size(); ++s)
    if (off[s] < off[s - 1]) table_error("queue_offsets", s, "decreases");
  if (off.back() != static_cast<int64_t>(t.queue_tasks.size()))
    table_error("queue_offsets", off.size() - 1,
                cat("is ", off.back(), ", not the ", t.queue_tasks.size(), " queued tasks"));
  std::vector<int32_t> seen(t.tasks.size(), -1);
  for (size_t i = 0; i < t.queue_tasks.size(); ++i) {
    const int32_t task = t.queue_tasks[i];
    if (task < 0 || task >= static_cast<int32_t>(t.tasks.size()))
      table_error("queue_tasks", i, cat("task ", task, " outside 0..", t.tasks.size()));
    if (seen[task] >= 0)
      table_error("queue_tasks", i, cat("task ", task, " is queued twice (also at ", seen[task], ")"));
    seen[task] = static_cast<int32_t>(i);
  }
  const std::vector<bool> tail = tail_tasks(t);
  for (size_t task = 0; task < seen.size(); ++task) {
    if (seen[task] < 0 && !tail[task]) table_error("tasks", task, "is in no queue and no tail");
    if (seen[task] >= 0 && tail[task]) table_error("tasks", task, "is a tail and also queued");
  }
}

void validate_buffers(const Tables& t) {
  for (size_t i = 0; i < t.buffers.size(); ++i) {
    const BufferDesc& b = t.buffers[i];
    if (b.dtype < 0 || b.dtype >= DTYPE_COUNT) table_error("buffers", i, cat("dtype ", b.dtype, " unknown"));
    if (b.kind < 0 || b.kind >= BUF_KIND_COUNT) table_error("buffers", i, cat("kind ", b.kind, " unknown"));
    if (b.rank < 0 || b.rank > MAX_RANK) table_error("buffers", i, cat("rank ", b.rank, " outside 0..4"));
    uint64_t elements = 1;
    for (int d = 0; d < b.rank; ++d) {
      if (b.shape[d] < 0) table_error("buffers", i, cat("shape[", d, "] is negative"));
      elements *= static_cast<uint64_t>(b.shape[d]);
    }
    if (elements * dtype_size(b.dtype) > b.bytes)
      table_error("buffers", i, cat(b.bytes, " bytes cannot hold the shape"));
    const bool arena = b.kind == BUF_ACTIVATION || b.kind == BUF_WORKSPACE;
    if (arena && (b.offset_or_ptr > t.arena_bytes || b.bytes > t.arena_bytes - b.offset_or_ptr))
      table_error("buffers", i, cat("arena range ", b.offset_or_ptr, " + ", b.bytes,
                                    " exceeds the arena of ", t.arena_bytes, " bytes"));
  }
}

}  // namespace

// ------------------------------------------------------------------ registry, header, validation

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;  // never destroyed: kinds may be looked up during static teardown
    reg->kinds[KIND_NOP] = {"nop", run_nop, {}};
    reg->kinds[KIND_TRACE] = {"trace", run_trace, {}};
    reg->kinds[KIND_ADD] = {"add", run_add, check_add};
    return reg;
  }();
  return *r;
}

void register_kind(int32_t kind, const std::string& name, KindFn run, KindCheck check) {
  if (kind < 0) throw std::invalid_argument(cat("task kind ", kind, " is negative"));
  if (!run) throw std::invalid_argument(cat("task kind ", kind, " has no function"));
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.kinds.find(kind);
  if (found != reg.kinds.end())
    throw std::invalid_argument(cat("task kind ", kind, " is already '", found->second.name, "'"));
  reg.kinds[kind] = {name, std::move(run), std::move(check)};
}

std::vector<std::pair<int32_t, std::string>> registered_kinds() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::pair<int32_t, std::string>> out;
  for (const auto& [id, info] : reg.kinds) out.emplace_back(id, info.name);
  return out;
}

GraphHeader make_header(const Tables& t) {
  GraphHeader h{};
  h.abi = MK_RUNTIME_ABI;
  h.num_tasks = static_cast<int32_t>(t.tasks.size());
  h.num_waits = static_cast<int32_t>(t.waits.size());
  h.num_signals = static_cast<int32_t>(t.signals.size());
  h.num_sms = static_cast<int32_t>(t.queue_offsets.size()) - 1;
  h.num_counters = t.num_counters;
  h.num_buffers = static_cast<int32_t>(t.buffers.size());
  h.iterations = t.iterations;
  h.arena_bytes = t.arena_bytes;
  return h;
}

void validate_tables(const Tables& t) {
  constexpr size_t kMaxRows = static_cast<size_t>(INT32_MAX);
  if (t.tasks.size() >= kMaxRows || t.waits.size() >= kMaxRows || t.signals.size() >= kMaxRows)
    table_error("tasks", 0, "tables exceed int32 indexing");
  if (t.num_counters < 0) table_error("num_counters", 0, "is negative");
  if (t.iterations < 1) table_error("iterations", 0, cat(t.iterations, " is not positive"));
  validate_tasks(t);
  validate_queues(t);
  validate_buffers(t);
}

}  // namespace mk
