// The CPU executor: worker threads play SMs and run the flat tables with the event protocol.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "mk/events.h"
#include "mk/tables.h"

namespace mk {

// A table that does not describe a runnable graph (bad index, uncovered task, ...). The binding
// turns it into Python's ValueError (it is a std::invalid_argument).
struct TableError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The watchdog fired: a wait went past the timeout. `status` names SM, task, counter, values.
struct DeadlockError : std::runtime_error {
  DeadlockError(const std::string& message, const RunStatus& s)
      : std::runtime_error(message), status(s) {}
  RunStatus status;
};

// What a kind function sees besides its TaskDesc: where it runs and the bound buffers.
struct ExecContext {
  int32_t task = 0;       // global task id
  int32_t sm = 0;         // SM whose queue holds it
  int32_t iteration = 0;  // 0-based iteration of the launch
  int32_t thread = 0;     // worker thread running that SM
  int32_t num_tasks = 0;
  int32_t num_buffers = 0;
  void* const* buffers = nullptr;            // resolved address of each buffer-table row
  const BufferDesc* buffer_descs = nullptr;  // the buffer table itself
  int64_t* trace = nullptr;                  // [iterations][num_tasks][2] or null if untraced
  std::atomic<int64_t>* clock = nullptr;     // global sequence clock of this launch

  template <class T>
  T* buffer(int32_t index) const {
    return static_cast<T*>(buffers[index]);
  }

  // A stamp later than every stamp taken before this task's waits were satisfied: relaxed is
  // enough because coherence orders read-modify-writes of one atomic along happens-before.
  int64_t tick() const { return clock->fetch_add(1, std::memory_order_relaxed); }
};

using KindFn = std::function<void(const TaskDesc&, ExecContext&)>;
// Returns an empty string when the task's args fit the buffer table, else what is wrong.
using KindCheck = std::function<std::string(const TaskDesc&, const std::vector<BufferDesc>&)>;

// Adds a task kind (the hook for the lowered block-graph kernels). Throws std::invalid_argument
// if the id is negative or taken. Executors built afterwards can run it.
void register_kind(int32_t kind, const std::string& name, KindFn run, KindCheck check = {});
std::vector<std::pair<int32_t, std::string>> registered_kinds();

// A kernel library emitted by backends/cpu (see the ABI in README): a shared object exporting, with
// C linkage, mk_abi_version, mk_num_kinds, mk_kind_name, mk_dispatch and mk_last_error. Loading
// checks the ABI; every kind >= KIND_FIRST_LOWERED of an executor built with it runs mk_dispatch.
class KernelLibrary {
 public:
  // dlopens `path`; throws std::runtime_error naming the path and the missing symbol, the dlerror
  // or the ABI mismatch.
  explicit KernelLibrary(const std::string& path);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  const std::string& path() const { return path_; }
  int32_t abi() const { return abi_; }
  int32_t num_kinds() const { return num_kinds_; }  // kinds KIND_FIRST_LOWERED .. + num_kinds - 1
  std::string kind_name(int32_t kind) const;        // "" outside the library's kinds
  // Runs one task; throws std::runtime_error with the kernel's code and mk_last_error() message.
  void dispatch(const TaskDesc& task, void* const* buffers, int32_t iteration) const;

 private:
  using AbiFn = int32_t (*)();
  using KindNameFn = const char* (*)(int32_t);
  using DispatchFn = int32_t (*)(int32_t, const TaskDesc*, void* const*, int32_t);
  using LastErrorFn = const char* (*)();

  std::string path_;
  void* handle_ = nullptr;
  int32_t abi_ = 0;
  int32_t num_kinds_ = 0;
  KindNameFn kind_name_ = nullptr;
  DispatchFn dispatch_ = nullptr;
  LastErrorFn last_error_ = nullptr;
};

// The tables of one scheduled graph, owned (copied from the caller's arrays).
struct Tables {
  std::vector<TaskDesc> tasks;
  std::vector<WaitDesc> waits;
  std::vector<SignalDesc> signals;
  std::vector<int32_t> queue_offsets;  // num_sms + 1
  std::vector<int32_t> queue_tasks;
  std::vector<BufferDesc> buffers;
  int32_t num_counters = 0;
  int32_t iterations = 1;
  uint64_t arena_bytes = 0;
};

GraphHeader make_header(const Tables& tables);

struct RunOptions {
  int32_t iterations = 0;     // <= 0: the tables' own count
  int32_t num_threads = 1;    // 1 .. MAX_THREADS; SM s runs on thread s % num_threads
  int64_t timeout_ms = 10000; // watchdog limit of one wait; <= 0 disables it
  int32_t max_delay_us = 0;   // > 0: random sleeps before tasks and signals, to shake interleavings
  uint64_t seed = 0;          // seeds those delays
  // Non-null: [iterations][num_tasks][2] (start, end) of each task's body, ns since the
  // launch began; a task that did not run keeps what the caller put there.
  int64_t* timeline = nullptr;
};

struct RunResult {
  int32_t iterations = 0;
  int32_t threads = 0;        // worker threads actually started (never more than SMs)
  std::vector<int64_t> trace; // [iterations][num_tasks][2] start/end stamps, -1 if not stamped;
                              // empty when no task is KIND_TRACE
};

// One caller-provided buffer: null `data` means "place it in the arena at its offset".
struct BufferBinding {
  void* data = nullptr;
  uint64_t bytes = 0;
};

class CpuExecutor {
 public:
  // Validates; throws TableError. With a library, kinds >= KIND_FIRST_LOWERED run its
  // mk_dispatch (a kind it does not define is a TableError) instead of the registry's.
  explicit CpuExecutor(Tables tables, std::shared_ptr<const KernelLibrary> library = nullptr);

  const Tables& tables() const { return tables_; }
  const std::shared_ptr<const KernelLibrary>& library() const { return library_; }
  GraphHeader header() const { return make_header(tables_); }

  // Resolves every buffer row to an address: a bound buffer or arena + offset (TableError if a
  // binding is too small or an arena buffer does not fit).
  std::vector<void*> bind(const std::vector<BufferBinding>& bindings, void* arena,
                          uint64_t arena_bytes) const;

  // Runs the launch; throws DeadlockError on a watchdog timeout, TableError on bad options, and
  // rethrows (as std::runtime_error naming the task) what a kind function threw.
  RunResult run(const std::vector<void*>& buffers, const RunOptions& options) const;

 private:
  Tables tables_;
  std::shared_ptr<const KernelLibrary> library_;
  std::vector<KindFn> kinds_;  // indexed by kind id, snapshot of the registry (or library)
  bool traced_ = false;
};

// Throws TableError describing the first inconsistency of `tables`.
void validate_tables(const Tables& tables);

}  // namespace mk
