"""The dispatcher side of the emitted megakernel: each shared task body as a device function,
and `struct Dispatch` (run, prefetch and stage by task kind; the shared-memory layout)
that mk/cuda_megakernel.cuh's persistent kernel calls."""

from __future__ import annotations

from mk.backends.cpu.emit import _indent, uses_iteration
from mk.backends.cuda import switch_values, switches
from mk.backends.cuda.device_lines import ARENA_SMEM
from mk.backends.cuda.entries import entry_words
from mk.backends.shared_bodies import SharedBodies, SharedFunction
from mk.runtime_tables import KIND_FIRST_LOWERED

SMEM_PER_CTA = 227 << 10  # dynamic + static shared memory a Hopper CTA may opt into
STATIC_SMEM_MARGIN = 16 << 10  # the kernels' static __shared__ arrays
DYNAMIC_SMEM = SMEM_PER_CTA - STATIC_SMEM_MARGIN
# The arena's shared-memory part the staging ring leaves where it can: with 16 KB the tiles of the
# attention merge spilled to global scratch and the qwen3-0.6b step lost 30 % (bench/RESULTS.md).
ARENA_KEEP = ARENA_SMEM


def device_function(fn: SharedFunction, inline: bool) -> str:
    """A shared body as a device function: a call of its own, or inlined into the dispatcher
    (switches.inline_bodies), the megakernel then making no calls at all."""
    head = [
        fn.comment(),
        f"__device__ {'__forceinline__' if inline else '__noinline__'} int32_t {fn.name}(const mk::TaskDesc* t, void* const* bp, "
        "mk::gpu::Arena& arena, int32_t iteration, int32_t ahead) {",
    ]
    if not stages_ahead(fn):
        head.append("  (void)ahead;  // nothing to do before the task's turn")
    return "\n".join([*head, *_indent(uses_iteration(fn.body), 1), "  return 0;", "}"]) + "\n"


def arena_smem(front: int, want: int = 0) -> tuple[int, int]:
    """(offset, bytes) of the arena's shared-memory part behind `front` bytes (the streamed
    bodies' and the staging ring): ARENA_SMEM, or `want` where a body asks for more;
    MK_CUDA_ARENA_SMEM (bytes) sets the cap, 0 keeps every tile in global scratch."""
    cap = switch_values.byte_count("MK_CUDA_ARENA_SMEM", max(ARENA_SMEM, want))
    offset = -(-front // 16) * 16
    room = DYNAMIC_SMEM - offset
    return offset, max(0, min(cap, room)) // 16 * 16


def _ring_offset(front: int) -> int:
    """Where the staging ring starts: behind `front` bytes of the bodies, 128-byte aligned."""
    return -(-front // 128) * 128


def ring_layout(front: int, staged: int) -> tuple[int, int] | None:
    """(offset, bytes) of the ring that weights are staged in, behind `front` bytes of the
    streamed bodies, when the largest task stages `staged` bytes: room for two such tasks (one
    runs while the next one's copies land) where the arena keeps ARENA_KEEP, else what is left;
    None when one task's weights do not fit."""
    offset = _ring_offset(front)
    if staged == 0:
        return offset, 0
    room = DYNAMIC_SMEM - offset
    ring = min(2 * (-(-staged // 128) * 128), room - ARENA_KEEP) // 128 * 128
    if ring < staged:
        ring = room // 128 * 128
    return (offset, ring) if ring >= staged else None


def stages_ahead(fn: SharedFunction) -> bool:
    """Whether the body copies its weights into the staging ring before its turn (kAheadStage)."""
    return any(line.startswith("if (ahead == mk::gpu::kAheadStage) {") for line in fn.body)


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
    39 KB for 2 layers), which an SM fetched anew at every layer. MK_CUDA_DISPATCH=kind: a
    number (a call site) per kind, as before."""
    if switches.dispatch_by_kind():
        return [fn for _, fn, _ in shared.calls], list(range(len(shared.calls)))
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
    staged: dict[str, int],
    buffers: int,
    batch_waits: bool = False,
    arena_want: int = 0,
    wide_front: int = 0,
    inline_run: bool = False,
    tails: bool = False,
) -> str:
    """`front`: the streamed bodies' shared memory; `staged`: per function, the bytes its
    weights take in the staging ring (padded rows included); `batch_waits`: MK_CUDA_WAIT_BATCH
    (on unless 0);
    `arena_want`: the arena's shared-memory part a body asks for beyond the usual; `wide_front`:
    the most shared memory a body whose room reaches into the arena's part takes; `inline_run`:
    `run` is forced inline too (switches.inline_walk); `tails`: some grid is a tail (task-tails),
    else the dispatcher leaves the tails' code out."""
    functions, of_kind = body_numbers(shared)
    cases = "\n".join(
        f"      case {i}: return {fn.name}(t, bp, arena, iteration, mk::gpu::kAheadNone);"
        for i, fn in enumerate(functions)
    )
    stages = "\n".join(
        f"      case {i}: return {fn.name}(t, bp, arena, iteration, mk::gpu::kAheadStage) != 0;"
        for i, fn in enumerate(functions)
        if stages_ahead(fn)
    )
    sizes = "\n".join(
        f"      case {i}: return {staged[fn.name]};"
        for i, fn in enumerate(functions)
        if staged.get(fn.name)
    )
    table = ", ".join(map(str, of_kind)) or "0"
    layout = ring_layout(front, max(staged.values(), default=0))
    assert layout is not None, "the emitter stages only what the ring holds"
    ring_offset, ring = layout
    # A wide body's tiles go behind its room: the arena's part takes all that is left.
    want = max(arena_want, DYNAMIC_SMEM if wide_front else 0)
    offset, arena = arena_smem(ring_offset + ring if ring else front, want)
    slots = body_slots(shared)
    return f"""\
// The body function of each lowered kind, from KIND_FIRST_LOWERED on (dispatch.body_numbers).
__constant__ uint16_t kBodyOfKind[{max(1, len(of_kind))}] = {{{table}}};

struct Dispatch {{
  static constexpr unsigned kRingOffset = {ring_offset};  // weights staged ahead (cuda_stage.cuh)
  static constexpr unsigned kRingBytes = {ring};
  static constexpr unsigned kArenaOffset = {offset};
  static constexpr unsigned kArenaBytes = {arena};
  static constexpr unsigned kSmemBytes = {max(offset + arena, wide_front)};
  static constexpr int kSlots = {slots};  // most buffers one body reads
  static constexpr int kBuffers = {buffers};  // rows of the buffer table
  static constexpr bool kBatchWaits = {"true" if batch_waits else "false"};  // MK_CUDA_WAIT_BATCH
  static constexpr bool kTails = {"true" if tails else "false"};  // some grid is a tail (task-tails)
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
  // Weight bytes a task of `kind` stages in the ring (0: none).
  __device__ static uint32_t stage_bytes(int32_t kind) {{
    switch (body(kind)) {{
{sizes}
      default: return 0;
    }}
  }}
  // One thread, ahead of the task's turn: copies its weights to arena.stage_base; whether it did.
  __device__ static bool stage(int32_t kind, const mk::TaskDesc* t, void* const* bp,
                               mk::gpu::Arena& arena, int32_t iteration) {{
    switch (body(kind)) {{
{stages}
      default: return false;
    }}
  }}
}};

// The host lays the queue entries out as backends/cuda/entries.py says.
static_assert(sizeof(mk::QueueEntry<Dispatch::kSlots>) == {4 * entry_words(slots)}, "queue entry layout");
"""
