"""Decode-loop steps of launch constants, rematerialised where they are read.

`nn.step %pos` (the kv length, the new key's position) is a task that writes `pos + t + offset`
every iteration, and every reader (each layer's attention and cache writes) loaded it back with
an L2 round trip and a barrier at the head of its body. When `pos` is a launch input no task
writes, its words are copied once into the CTA's shared memory at the launch's start
(`mk_launch_words`, Dispatch::load_launch_words) and a reader computes the step from them and
its iteration instead: a shared-memory read, no round trip. The step's own task still runs for
any other reader (a library kernel's)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mk.backends.cpu.emit import _int, _nn_attrs, grid_kernel
from mk.backends.cpu.emit_ops import BufferRef
from mk.backends.cuda import switches
from mk.dialects.mugraph import KernelOp
from mk.dialects.task import BufferOp, GridOp

MOST_WORDS = 192  # the launch words one CTA holds: one a thread of warps 2 and up
NO_LAUNCH_WORDS = "  static constexpr int kLaunchWords = 0;"  # Dispatch's member without them


@dataclass(frozen=True)
class LaunchStep:
    """A step result computed in its readers: word w of the source (or its only word, `single`)
    plus the iteration and the offset."""

    word: int
    single: bool
    offset: int

    def value(self, index: str) -> str:
        """The step's element at flat `index` (an expression) in iteration `iteration`."""
        word = f"{self.word}" if self.single else f"{self.word} + ({index})"
        return f"static_cast<int64_t>(mk_launch_words[{word}]) + iteration + {self.offset}"


@dataclass(frozen=True)
class LaunchWords:
    """The rematerialised steps by their result's buffer index, and the words' sources:
    (buffer index, words) copied in order."""

    steps: dict[int, LaunchStep]
    sources: tuple[tuple[int, int], ...]

    @property
    def count(self) -> int:
        return sum(n for _, n in self.sources)

    def declaration(self) -> str:
        """The shared-memory words, declared before the bodies that read them."""
        return (
            f"// Launch-constant words (launch_words.py), copied at each launch's start.\n"
            f"__shared__ int32_t mk_launch_words[{self.count}];\n"
        )

    def loader(self) -> str:
        """Dispatch's kLaunchWords and load_launch_words: thread `i` of warps 2 and up copies
        word i."""
        if not self.sources:
            return NO_LAUNCH_WORDS
        lines, word = [], 0
        for buffer, n in self.sources:
            lines.append(
                f"    if (i >= {word} && i < {word + n}) "
                f"mk_launch_words[i] = static_cast<const int32_t*>(b[{buffer}])[i - {word}];"
            )
            word += n
        body = "\n".join(lines)
        return (
            f"  static constexpr int kLaunchWords = {self.count};  // launch_words.py\n"
            f"  __device__ static void load_launch_words(void* const* b, int i) {{\n{body}\n  }}"
        )


def launch_words(
    grids: list[GridOp], buffers: list[BufferOp], refs: dict[str, BufferRef]
) -> LaunchWords:
    """The steps of i32 launch inputs that no task writes, each the only writer of its result
    (switches.launch_steps; none when off)."""
    if switches.launch_steps() == "0":
        return LaunchWords({}, ())
    writers: dict[str, int] = {}
    for grid in grids:
        for _, fp in grid.footprints[len(grid.reads) :]:
            writers[fp.buffer_name] = writers.get(fp.buffer_name, 0) + 1
    steps: dict[int, LaunchStep] = {}
    sources: list[tuple[int, int]] = []
    first: dict[int, int] = {}  # a source buffer's first word
    for grid in grids:
        gk = grid_kernel(grid, refs, "CUDA")
        if not isinstance(gk.kernel, KernelOp) or gk.kernel.kind.data != "step":
            continue
        source, results = gk.operands[0], gk.library_results(grid)
        if len(results) != 1 or not _constant_i32(buffers[source.index], source, writers):
            continue
        result = results[0][0]
        if writers[buffers[result.index].sym_name.data] != 1:
            continue
        single = math.prod(source.shape) == 1
        if not single and source.shape != result.shape:
            continue
        if source.index not in first:
            words, n = sum(n for _, n in sources), math.prod(source.shape)
            if words + n > MOST_WORDS:
                continue
            first[source.index] = words
            sources.append((source.index, n))
        offset = _int(_nn_attrs(gk.kernel)["offset"])
        steps[result.index] = LaunchStep(first[source.index], single, offset)
    return LaunchWords(steps, tuple(sources))


def _constant_i32(op: BufferOp, ref: BufferRef, writers: dict[str, int]) -> bool:
    """A launch input of i32 words that no task writes."""
    return (
        op.kind.data == "input"
        and ref.dtype == "mk::DTYPE_I32"
        and not ref.flagged
        and op.sym_name.data not in writers
    )
