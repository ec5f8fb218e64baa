"""The dispatcher side of the emitted megakernel: each shared task body as a device function,
and `struct Dispatch` (run by task kind; the shared-memory layout) that mk/cuda_megakernel.cuh's
persistent kernel calls."""

from __future__ import annotations

from mk.backends.cpu.emit import _indent, uses_iteration
from mk.backends.cuda import switch_values
from mk.backends.cuda.device_lines import ARENA_SMEM
from mk.backends.cuda.entries import entry_words, head_words
from mk.backends.cuda.launch_words import NO_LAUNCH_WORDS
from mk.backends.shared_bodies import SharedBodies, SharedFunction
from mk.runtime_tables import KIND_FIRST_LOWERED

SMEM_PER_CTA = 227 << 10  # dynamic + static shared memory a Hopper CTA may opt into
STATIC_SMEM_MARGIN = 16 << 10  # the kernels' static __shared__ arrays
DYNAMIC_SMEM = SMEM_PER_CTA - STATIC_SMEM_MARGIN


def device_function(fn: SharedFunction, inline: bool) -> str:
    """A shared body as a device function: a call of its own, or inlined into the dispatcher
    (switches.inline_bodies), the megakernel then making no calls at all."""
    head = [
        fn.comment(),
        f"__device__ {'__forceinline__' if inline else '__noinline__'} int32_t {fn.name}(const mk::TaskDesc* t, void* const* bp, "
        "mk::gpu::Arena& arena, int32_t iteration) {",
    ]
    return "\n".join([*head, *_indent(uses_iteration(fn.body), 1), "  return 0;", "}"]) + "\n"


def arena_smem(front: int, want: int = 0) -> tuple[int, int]:
    """(offset, bytes) of the arena's shared-memory part behind `front` bytes (the streamed
    bodies'): ARENA_SMEM, or `want` where a body asks for more;
    MK_CUDA_ARENA_SMEM (bytes) sets the cap, 0 keeps every tile in global scratch."""
    cap = switch_values.byte_count("MK_CUDA_ARENA_SMEM", max(ARENA_SMEM, want))
    offset = -(-front // 16) * 16
    room = DYNAMIC_SMEM - offset
    return offset, max(0, min(cap, room)) // 16 * 16


def slot_rows(shared: SharedBodies) -> tuple[tuple[int, ...], ...]:
    """Per kind (grid), the buffer-table rows of its body's slots: the queue entries carry them."""
    return tuple(tuple(shared.table[first : first + fn.slots]) for _, fn, first in shared.calls)


def body_slots(shared: SharedBodies) -> int:
    """Most buffers one body reads (at least 1): Dispatch::kSlots."""
    return max([fn.slots for fn in shared.functions] + [1])


def body_numbers(shared: SharedBodies) -> tuple[list[SharedFunction], list[int]]:
    """The body functions in the order of their first kinds, and each kind's (grid's) function
    number. The dispatcher switches on the number, one call site per function: a model's layers
    run the same bodies under kinds of their own, and with a case per kind each layer's call was
    other lines of the dispatcher's code (qwen3-0.6b's 28 layers: 106 KB of dispatcher against
    39 KB for 2 layers), which an SM fetched anew at every layer."""
    numbers: dict[str, int] = {}
    functions: list[SharedFunction] = []
    of_kind = []
    for _, fn, _ in shared.calls:
        if fn.name not in numbers:
            numbers[fn.name] = len(functions)
            functions.append(fn)
        of_kind.append(numbers[fn.name])
    return functions, of_kind


def dispatch_struct(
    shared: SharedBodies,
    front: int,
    buffers: int,
    batch_waits: bool = False,
    arena_want: int = 0,
    wide_front: int = 0,
    inline_run: bool = False,
    tails: bool = False,
    launch_words: str = NO_LAUNCH_WORDS,
) -> str:
    """`front`: the streamed bodies' shared memory; `batch_waits`: MK_CUDA_WAIT_BATCH (on unless
    0); `arena_want`: the arena's shared-memory part a body asks for beyond the usual; `wide_front`:
    the most shared memory a body whose room reaches into the arena's part takes; `inline_run`:
    `run` is forced inline too (switches.inline_walk); `tails`: some grid is a tail (task-tails),
    else the dispatcher leaves the tails' code out; `launch_words`: LaunchWords.loader's members."""
    functions, of_kind = body_numbers(shared)
    cases = "\n".join(
        f"      case {i}: return {fn.name}(t, bp, arena, iteration);"
        for i, fn in enumerate(functions)
    )
    table = ", ".join(map(str, of_kind)) or "0"
    # A wide body's tiles go behind its room: the arena's part takes all that is left.
    want = max(arena_want, DYNAMIC_SMEM if wide_front else 0)
    offset, arena = arena_smem(front, want)
    slots = body_slots(shared)
    return f"""\
// The body function of each lowered kind, from KIND_FIRST_LOWERED on (dispatch.body_numbers).
__constant__ uint16_t kBodyOfKind[{max(1, len(of_kind))}] = {{{table}}};

struct Dispatch {{
  static constexpr unsigned kArenaOffset = {offset};
  static constexpr unsigned kArenaBytes = {arena};
  static constexpr unsigned kSmemBytes = {max(offset + arena, wide_front)};
  static constexpr int kSlots = {slots};  // most buffers one body reads
  static constexpr int kBuffers = {buffers};  // rows of the buffer table
  static constexpr bool kBatchWaits = {"true" if batch_waits else "false"};  // MK_CUDA_WAIT_BATCH
  static constexpr bool kTails = {"true" if tails else "false"};  // some grid is a tail (task-tails)
{launch_words}
  // The function number of a task's kind; -1 for a kind this program does not have.
  __device__ static int body(int32_t kind) {{
    const int32_t i = kind - {KIND_FIRST_LOWERED};
    return i >= 0 && i < {len(of_kind)} ? kBodyOfKind[i] : -1;
  }}
  __device__ static {"__forceinline__ " if inline_run else ""}int32_t run(int32_t kind, const mk::TaskDesc* t, void* const* bp,
                                mk::gpu::Arena& arena, int32_t iteration) {{
    switch (body(kind)) {{
{cases}
      default: return 0x7fffffff;  // an unknown kind fails the task
    }}
  }}
}};

// The host lays the queue entries out as backends/cuda/entries.py says.
static_assert(sizeof(mk::QueueEntry<Dispatch::kSlots>) == {4 * entry_words(slots)}, "queue entry layout");
static_assert(sizeof(mk::LaunchHead<Dispatch::kSlots>) == {4 * head_words(slots)}, "launch head layout");
"""
