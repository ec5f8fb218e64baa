// The flat tables a scheduled task graph lowers to, shared by the CPU executor and the CUDA megakernel.
//
// A scheduled `task.graph` becomes a handful of plain arrays (all little-endian, no pointers
// inside any row except BufferDesc::offset_or_ptr once the host has bound it):
//
//   GraphHeader      one row: the sizes of every table below and the iteration count
//   TaskDesc[]       one row per global task id (grid tasks in block order, row-major in a grid)
//   WaitDesc[]       the waits of all tasks, task i owning rows [wait_begin, wait_end)
//   SignalDesc[]     the signals of all tasks, task i owning rows [signal_begin, signal_end)
//   queue_offsets[]  int32[num_sms + 1], CSR offsets: SM s runs queue_tasks[offsets[s] .. offsets[s+1])
//   queue_tasks[]    int32 global task ids, every task but the tails exactly once over all queues
//   BufferDesc[]     one row per task.buffer, in declaration order
//   counters[]       uint32[num_counters], one per event-tensor element, zeroed once per launch
//
// Every SM runs its queue once per iteration t = 0 .. iterations-1; the event protocol
// (thresholds that grow with t, so counters never reset) lives in mk/events.h. A tail task is
// in no queue: the SM whose signal completes its event element (brings the counter to
// count * (t + 1) in iteration t) runs it right away, in that iteration, before its next task.
//
// Python builds the same rows as NumPy structured arrays (python/mk/runtime_tables.py); the
// static_asserts here and the binding `mk._runtime.table_layouts()` keep the three in step.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MK_HOST_DEVICE __host__ __device__
#else
#define MK_HOST_DEVICE
#endif

// `#pragma unroll` in code that a host compiler sees too (MK_HOST_DEVICE functions): only the
// device pass takes it, so the host's -Wall stays quiet.
#if defined(__CUDA_ARCH__)
#define MK_UNROLL _Pragma("unroll")
#else
#define MK_UNROLL
#endif

namespace mk {

// Task kinds with a built-in implementation; kinds >= KIND_FIRST_LOWERED belong to the
// block-graph kernels the lowering emits (registered with mk::register_kind on the CPU).
enum TaskKind : int32_t {
  KIND_NOP = 0,    // does nothing: pure synchronisation
  KIND_TRACE = 1,  // stamps start/end from a global clock into the trace (tests, profiling)
  KIND_ADD = 2,    // float32 dst[i] = a[i] + b[i] for i in [begin, end); see ADD_* below
  KIND_FIRST_LOWERED = 16,
};

// TaskDesc::args of KIND_ADD: buffer-table indices, then the element range.
enum AddArg : int32_t { ADD_DST = 0, ADD_A = 1, ADD_B = 2, ADD_BEGIN = 3, ADD_END = 4 };

// Element types of BufferDesc::dtype (0 = raw bytes, no element type).
enum DType : int32_t {
  DTYPE_BYTES = 0,
  DTYPE_F32 = 1,
  DTYPE_F16 = 2,
  DTYPE_BF16 = 3,
  DTYPE_F64 = 4,
  DTYPE_I8 = 5,
  DTYPE_I32 = 6,
  DTYPE_I64 = 7,
  DTYPE_U8 = 8,
  DTYPE_COUNT = 9,
};

// Bytes per element of each DType (1 for DTYPE_BYTES).
MK_HOST_DEVICE inline int32_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case DTYPE_F32: case DTYPE_I32: return 4;
    case DTYPE_F16: case DTYPE_BF16: return 2;
    case DTYPE_F64: case DTYPE_I64: return 8;
    default: return 1;
  }
}

// BufferDesc::kind, mirroring task.buffer's kinds. Arena kinds live at `offset` inside the one
// activation arena; the others are bound by the host to caller memory at launch.
enum BufferKind : int32_t {
  BUF_INPUT = 0,
  BUF_WEIGHT = 1,
  BUF_OUTPUT = 2,
  BUF_ACTIVATION = 3,
  BUF_WORKSPACE = 4,
  BUF_KIND_COUNT = 5,
};

constexpr int32_t MAX_COORDS = 3;     // task coordinates beyond a grid's rank are 0
constexpr int32_t MAX_TASK_ARGS = 7;  // sized so that TaskDesc is one 64-byte line
constexpr int32_t MAX_RANK = 4;
constexpr int32_t MAX_THREADS = 64;   // CPU executor worker threads

// One task: what to run (kind, args) at which tile (grid, coord), and its slices of the wait and
// signal tables. Waits are checked in row order before the task runs; signals fire after it.
struct TaskDesc {
  int32_t kind;                  // TaskKind or a lowered kernel id
  int32_t grid;                  // index of the task.grid it came from (for messages, profiles)
  int32_t coord[MAX_COORDS];     // tile coordinates inside that grid
  int32_t wait_begin;            // first WaitDesc row of this task
  int32_t wait_end;              // one past its last WaitDesc row
  int32_t signal_begin;          // first SignalDesc row of this task
  int32_t signal_end;            // one past its last SignalDesc row
  int32_t args[MAX_TASK_ARGS];   // kind-specific small parameters (e.g. AddArg), unused are 0
};

// One wait: in iteration t the task needs counters[counter] >= count * (t + 1 - distance)
// (no wait when that is <= 0). `count` is the event's producer signals per element per
// iteration; `distance` > 0 makes the wait loop-carried (on iteration t - distance).
struct WaitDesc {
  int32_t counter;   // event-element counter index, < GraphHeader::num_counters
  int32_t count;     // >= 1
  int32_t distance;  // >= 0
};

// One signal: after the task ran, counters[counter] += 1 (release). When this add brings the
// counter to count * (t + 1) in iteration t, the signalling SM runs task `tail` next (if >= 0;
// every signal row of one counter names the same tail and count).
struct SignalDesc {
  int32_t counter;
  int32_t tail = -1;  // task id, or -1
  int32_t count = 0;  // the event's signals per element per iteration (with a tail; else 0)
};

// One buffer. Arena buffers: offset_or_ptr is the byte offset inside the arena. Bound buffers
// (input, weight, output): the host overwrites offset_or_ptr with the device/host address.
struct BufferDesc {
  uint64_t offset_or_ptr;     // arena byte offset, or the bound address
  uint64_t bytes;             // size in bytes, >= product(shape) * dtype_size(dtype)
  int32_t dtype;              // DType
  int32_t rank;               // 0 .. MAX_RANK
  int32_t kind;               // BufferKind
  int32_t reserved;           // 0; keeps shape 8-byte aligned
  int64_t shape[MAX_RANK];    // extents; entries at and past `rank` are 0
};

// The sizes of every table and the iteration count: what a launch needs besides the pointers.
struct GraphHeader {
  int32_t abi;            // MK_RUNTIME_ABI the tables were built for
  int32_t num_tasks;      // rows of TaskDesc
  int32_t num_waits;      // rows of WaitDesc
  int32_t num_signals;    // rows of SignalDesc
  int32_t num_sms;        // queues; queue_offsets has num_sms + 1 entries
  int32_t num_counters;   // event-element counters
  int32_t num_buffers;    // rows of BufferDesc
  int32_t iterations;     // times every queue runs per launch (the decode loop)
  uint64_t arena_bytes;   // size of the activation arena
};

// Where a launch stopped if it did not finish: written once (first error wins) by whichever
// SM's watchdog fires, then read by the host to raise an error naming task, event and SM.
struct RunStatus {
  int32_t error;       // RunError
  int32_t sm;          // SM whose wait timed out
  int32_t task;        // global task id it was about to run
  int32_t counter;     // the counter it waited on
  int32_t iteration;   // iteration t of that wait
  uint32_t value;      // counter value seen last
  uint32_t threshold;  // value it needed
  int32_t wait_ms;     // how long it had waited
};

enum RunError : int32_t { RUN_OK = 0, RUN_TIMEOUT = 1, RUN_KERNEL_FAILED = 2, RUN_STOPPED = 3 };

static_assert(sizeof(TaskDesc) == 64, "TaskDesc layout drifted from runtime_tables.TASK_DESC");
static_assert(offsetof(TaskDesc, wait_begin) == 20, "TaskDesc layout drifted");
static_assert(offsetof(TaskDesc, args) == 36, "TaskDesc layout drifted");
static_assert(sizeof(WaitDesc) == 12, "WaitDesc layout drifted from runtime_tables.WAIT_DESC");
static_assert(sizeof(SignalDesc) == 12, "SignalDesc layout drifted from runtime_tables.SIGNAL_DESC");
static_assert(sizeof(BufferDesc) == 64, "BufferDesc layout drifted from runtime_tables.BUFFER_DESC");
static_assert(offsetof(BufferDesc, shape) == 32, "BufferDesc layout drifted");
static_assert(sizeof(GraphHeader) == 40, "GraphHeader layout drifted");
static_assert(sizeof(RunStatus) == 32, "RunStatus layout drifted");

}  // namespace mk
