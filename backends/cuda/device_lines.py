"""Task-body statements for the device: the CPU emitters' C++ rewritten for mk/cuda_kernels.h,
and tile declarations with their static sizes (one arena block per body where it fits)."""

from __future__ import annotations

import re
from collections.abc import Sequence

ARENA_SMEM = 48 << 10  # most the arena's shared-memory part takes
TILE_BLOCK = ARENA_SMEM  # most bytes of tiles a body allocates as one block (it fits the fast part)

# Statement rewrites from the CPU emitters' C++ to device C++ (applied in order).
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"^for \(float& e : (\w+)\) e = e / (.+);$", r"mk::gpu::div_tile(\1, \2);"),
        (
            r"^(\w+) = mk::cpu::as_float\((\w+)\);$",
            r"mk::gpu::copy_tile(\1, mk::gpu::as_float(arena, \2));",
        ),
        (r"^(\w+) = (\w+);$", r"mk::gpu::copy_tile(\1, \2);"),
        (r"^const std::vector<(\w+)> ", r"const mk::gpu::Tile<\1> "),
        (r"mk::cpu::as_float\(", "mk::gpu::as_float(arena, "),
        (
            r"^(mk::cpu::(?:rms_norm_tile|accum_softmax_update|lib_attention)\(.*)\);$",
            r"\1, arena);",
        ),
        (r"mk::cpu::", "mk::gpu::"),
        (r"std::(max|min)\(", r"mk::gpu::i\1("),
        (r"std::", "::"),
    )
)
_DECL = re.compile(r"^std::vector<(float|int64_t)> (\w+);$")


def _tile_bytes(ctype: str, n: int) -> int:
    return -(-max(1, n) * (4 if ctype == "float" else 8) // 16) * 16


def _tile_block(lines: Sequence[str], sizes: dict[str, int]) -> tuple[dict[str, int], int] | None:
    """(byte offset per declared tile, total) when the tiles together take at most TILE_BLOCK
    bytes: one arena allocation per task instead of one per tile (each a dependent round trip
    through the arena's bookkeeping in local memory)."""
    total, offsets = 0, {}
    for line in lines:
        if decl := _DECL.match(line):
            ctype, name = decl.groups()
            offsets[name] = total
            total += _tile_bytes(ctype, sizes[name])
    return (offsets, total) if offsets and total <= TILE_BLOCK else None


def device_lines(lines: Sequence[str], sizes: dict[str, int]) -> tuple[list[str], int]:
    """The statements rewritten for the device, tile declarations given their static sizes;
    and the scratch bytes of those tiles."""
    out, scratch = [], 0
    block = _tile_block(lines, sizes)
    for line in lines:
        decl = _DECL.match(line)
        if decl:
            ctype, name = decl.groups()
            if block is None:  # each tile aligned on its own
                scratch += 16 + _tile_bytes(ctype, sizes[name])
                out.append(f"mk::gpu::Tile<{ctype}> {name}(arena, {sizes[name]});")
                continue
            offsets, total = block
            if offsets[name] == 0:
                scratch += 16 + total
                out.append(f"uint8_t* const tiles = static_cast<uint8_t*>(arena.alloc({total}));")
            storage = f"reinterpret_cast<{ctype}*>(tiles + {offsets[name]})"
            out.append(f"mk::gpu::Tile<{ctype}> {name}({storage}, {sizes[name]});")
            continue
        for pattern, replacement in _REWRITES:
            line = pattern.sub(replacement, line)
        if line.startswith("for (int64_t it = 0;"):
            # Temporaries of one iteration are dead in the next: reuse their scratch.
            out += ["const mk::gpu::ArenaMark loop_mark = arena.mark();", line]
            out.append("arena.reset(loop_mark);")
            continue
        out.append(line)
    return out, scratch
