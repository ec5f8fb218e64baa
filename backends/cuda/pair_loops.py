"""Element loops that only compute and store 16-bit runs take two elements a thread.

A prefill body's epilogue stores each element of its f32 sums as one 2-byte store, with its own
row and column arithmetic: ~16 % of a gemm body's ncu samples (bench/RESULTS.md, session 50).
Two neighbouring elements a thread make one 4-byte store (`mk::gpu::store_run_pair`) where the
runs' columns come in pairs. Element e then lives on thread e / 2 mod blockDim, not e mod
blockDim: only a loop that writes no tile pairs, and its reads are marked so that barriers.py
waits for any earlier loop that wrote them. On the H200 qwen3-0.6b's prefill took 10.91
against 11.06 ms without (bench/RESULTS.md, session 51); by default only loops of
switches.PAIR_MIN elements or more pair, which leaves a decode step's CUDA as it was.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mk.backends.cuda.barriers import ELEMENT_LOOP, Loop

_STORE = re.compile(
    r"^mk::gpu::store_run_elem<(mk::DTYPE_(?:BF16|F16)), (\d+)>\((.*), e, ([^,]*)\);(  // store)?$"
)
_VALUE = re.compile(r"^const \w+ \w+ = .*;$")
PAIRED = "pair"  # the offset barriers.py sees for a paired loop's reads: never its own element


def _pairable(loop: Loop, least: int) -> bool:
    header = ELEMENT_LOOP.match(loop.text[0]) if loop.text else None
    if header is None or int(header.group(1)) != loop.n or loop.writes or loop.text[-1] != "}":
        return False
    if loop.n % 2 or loop.n < least:
        return False
    stores = [_STORE.match(line) for line in loop.text[1:-1]]
    if not any(stores):
        return False
    return all(
        (s is not None and int(s.group(2)) % 2 == 0) or _VALUE.match(line)
        for s, line in zip(stores, loop.text[1:-1], strict=True)
    )


def _paired(loop: Loop) -> Loop:
    body: list[str] = []
    stores: list[str] = []
    for line in loop.text[1:-1]:
        store = _STORE.match(line)
        if store is None:
            body.append(line)
            continue
        k = len(stores)
        body.append(f"mk_pair[{k}][j] = {store.group(4)};")
        stores.append(
            f"mk::gpu::store_run_pair<{store.group(1)}, {store.group(2)}>({store.group(3)}, e2, "
            f"mk_pair[{k}][0], mk_pair[{k}][1]);  // store"
        )
    text = (
        f"for (uint32_t e2 = 2 * threadIdx.x; e2 < {loop.n}u; e2 += 2 * MK_CTA_THREADS) {{",
        f"float mk_pair[{len(stores)}][2];",
        "#pragma unroll",
        "for (uint32_t j = 0; j < 2; ++j) {",
        "const uint32_t e = e2 + j;",
        *body,
        "}",
        *stores,
        "}",
    )
    reads = tuple((t, PAIRED if at == "e" else at) for t, at in loop.reads)
    return Loop(loop.n, reads, loop.writes, text)


def pair_loops(loops: Sequence[Loop], least: int = 2) -> list[Loop]:
    """`loops` with every loop of at least `least` elements that only computes values and
    stores 16-bit runs of even length taking two elements a thread."""
    return [_paired(loop) if _pairable(loop, least) else loop for loop in loops]
