"""Tile arithmetic of mugraph block graphs: imap/fmap/omap checks, tile shapes and tile slices.

Everything here works on plain Python ints and tuples so the verifier, the block-by-block
interpreter and the cost model share one definition of "which part of a tensor a block sees".

Conventions:
- a grid is `(x, y, z)`; a block is its coordinates `(bx, by, bz)` with `0 <= bx < x` etc.;
- a map (imap/omap) has one entry per grid axis: the tensor dim that axis partitions, or -1;
- `fmap` is the dim the for-loop walks, or -1. When a dim is both partitioned by a grid axis
  and walked by the for-loop, the grid splits it first and the loop walks the block's chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

AXES = ("x", "y", "z")

Shape = tuple[int, ...]
Grid = tuple[int, int, int]
BlockCoord = tuple[int, int, int]


UNARY_KINDS = ("exp", "sqrt", "rsqrt", "square", "neg", "relu", "sigmoid", "silu", "gelu")
UNARY_KINDS += ("recip", "scale", "cast")
BINARY_KINDS = ("add", "sub", "mul", "div", "maximum", "minimum")
REDUCE_KINDS = ("sum", "max", "mean")


class AccumKind(NamedTuple):
    """What a `mugraph.accum` kind does to each iteration's tile and how iterations combine."""

    reduce_last: bool  # reduce the tile's last dim (kept as size 1) before combining
    square: bool  # square the elements first
    combine: str  # "sum" or "max" across iterations
    mean: bool  # finally divide by the extent walked: last dim × forloop


ACCUM_KINDS: dict[str, AccumKind] = {
    "sum": AccumKind(False, False, "sum", False),
    "max": AccumKind(False, False, "max", False),
    "sum_last": AccumKind(True, False, "sum", False),
    "max_last": AccumKind(True, False, "max", False),
    "mean_last": AccumKind(True, False, "sum", True),
    "sum_sq_last": AccumKind(True, True, "sum", False),
    "mean_sq_last": AccumKind(True, True, "sum", True),
}


class MapError(ValueError):
    """A map that does not fit a tensor, a grid or a tile; the message names the mismatch."""


def shape_str(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def check_grid(grid: Sequence[int]) -> Grid:
    if len(grid) != 3:
        raise MapError(f"grid must have 3 extents (x, y, z), got {list(grid)}")
    if any(g < 1 for g in grid):
        raise MapError(f"grid extents must be >= 1, got {list(grid)}")
    return (grid[0], grid[1], grid[2])


def check_map(name: str, dims: Sequence[int], rank: int) -> None:
    """A map has 3 entries in [-1, rank) and no two grid axes partition the same dim."""
    if len(dims) != 3:
        raise MapError(f"{name} must have 3 entries (grid axes x, y, z), got {list(dims)}")
    seen: dict[int, str] = {}
    for axis, d in zip(AXES, dims, strict=True):
        if d < -1 or d >= rank:
            raise MapError(
                f"{name} maps grid axis {axis} to dim {d}, but the tensor has rank {rank}"
            )
        if d >= 0 and d in seen:
            raise MapError(
                f"{name} {list(dims)} maps grid axes {seen[d]} and {axis} to the same dim {d}"
            )
        if d >= 0:
            seen[d] = axis


def _block_parts(shape: Shape, grid: Grid, dims: Sequence[int]) -> list[int]:
    """How many blocks split each tensor dim (1 where no grid axis maps to it)."""
    parts = [1] * len(shape)
    for extent, d in zip(grid, dims, strict=True):
        if d >= 0:
            parts[d] = extent
    return parts


def input_tile_shape(
    shape: Sequence[int], grid: Sequence[int], imap: Sequence[int], fmap: int, forloop: int
) -> Shape:
    """The tile one block sees in one for-loop iteration; MapError if a split does not divide."""
    shape, g = tuple(shape), check_grid(grid)
    check_map("imap", imap, len(shape))
    if fmap < -1 or fmap >= len(shape):
        raise MapError(f"fmap is dim {fmap}, but the tensor has rank {len(shape)}")
    parts = _block_parts(shape, g, imap)
    tile = list(shape)
    for d, (size, p) in enumerate(zip(shape, parts, strict=True)):
        if size % p:
            axis = AXES[list(imap).index(d)]
            raise MapError(
                f"dim {d} of the {shape_str(shape)} tensor ({size}) is not divisible by "
                f"grid axis {axis} ({p})"
            )
        tile[d] = size // p
    if fmap >= 0:
        if tile[fmap] % forloop:
            raise MapError(
                f"dim {fmap} of the block's {shape_str(tile)} chunk ({tile[fmap]}) is not "
                f"divisible by forloop {forloop}"
            )
        tile[fmap] //= forloop
    return tuple(tile)


def input_tile_slices(
    shape: Sequence[int],
    grid: Sequence[int],
    imap: Sequence[int],
    fmap: int,
    forloop: int,
    block: Sequence[int],
    iteration: int,
) -> tuple[slice, ...]:
    """The part of the full tensor block `block` reads in for-loop iteration `iteration`."""
    tile = input_tile_shape(shape, grid, imap, fmap, forloop)
    starts = [0] * len(tile)
    for axis, (b, d) in enumerate(zip(_check_block(block, grid), imap, strict=True)):
        if d >= 0:
            chunk = shape[d] // grid[axis]
            starts[d] += b * chunk
    if fmap >= 0:
        if not 0 <= iteration < forloop:
            raise MapError(f"iteration {iteration} is outside forloop range {forloop}")
        starts[fmap] += iteration * tile[fmap]
    return tuple(slice(s, s + t) for s, t in zip(starts, tile, strict=True))


def input_block_slices(
    shape: Sequence[int], grid: Sequence[int], imap: Sequence[int], block: Sequence[int]
) -> tuple[slice, ...]:
    """The part of the full tensor block `block` reads over the whole for-loop (its footprint)."""
    parts = _block_parts(tuple(shape), check_grid(grid), imap)
    starts = [0] * len(shape)
    for b, d in zip(_check_block(block, grid), imap, strict=True):
        if d >= 0:
            starts[d] = b * (shape[d] // parts[d])
    return tuple(slice(s, s + size // p) for s, size, p in zip(starts, shape, parts, strict=True))


def output_tile_shape(
    shape: Sequence[int], grid: Sequence[int], omap: Sequence[int], summed: bool = False
) -> Shape:
    """The tile each block writes; MapError on a non-dividing split or a racing grid axis (an
    accumulating output, `summed`, adds the tiles of the blocks along such an axis instead)."""
    shape, g = tuple(shape), check_grid(grid)
    check_map("omap", omap, len(shape))
    for axis, (extent, d) in enumerate(zip(g, omap, strict=True)):
        if d < 0 and extent > 1 and not summed:
            raise MapError(
                f"grid axis {AXES[axis]} (extent {extent}) partitions no dim of the result, so "
                f"{extent} blocks would write the same tile; give a partial result an extra "
                f"dim indexed by axis {AXES[axis]}"
            )
    parts = _block_parts(shape, g, omap)
    for d, (size, p) in enumerate(zip(shape, parts, strict=True)):
        if size % p:
            axis = AXES[list(omap).index(d)]
            raise MapError(
                f"dim {d} of the {shape_str(shape)} result ({size}) is not divisible by "
                f"grid axis {axis} ({p})"
            )
    return tuple(size // p for size, p in zip(shape, parts, strict=True))


def output_tile_slices(
    shape: Sequence[int],
    grid: Sequence[int],
    omap: Sequence[int],
    block: Sequence[int],
    summed: bool = False,
) -> tuple[slice, ...]:
    """The part of the full result block `block` writes (or adds to, when `summed`)."""
    tile = output_tile_shape(shape, grid, omap, summed)
    starts = [0] * len(tile)
    for b, d in zip(_check_block(block, grid), omap, strict=True):
        if d >= 0:
            starts[d] = b * tile[d]
    return tuple(slice(s, s + t) for s, t in zip(starts, tile, strict=True))


def _check_block(block: Sequence[int], grid: Sequence[int]) -> BlockCoord:
    if len(block) != 3 or not all(0 <= b < g for b, g in zip(block, grid, strict=True)):
        raise MapError(f"block {list(block)} is outside grid {list(grid)}")
    return (block[0], block[1], block[2])


def grid_blocks(grid: Sequence[int]) -> Iterator[BlockCoord]:
    """Every block of a grid, x fastest (CUDA's linear block order)."""
    gx, gy, gz = check_grid(grid)
    for bz in range(gz):
        for by in range(gy):
            for bx in range(gx):
                yield (bx, by, bz)


def broadcast_shapes(*shapes: Sequence[int]) -> Shape | None:
    """NumPy broadcasting of tile shapes, or None when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def reduce_shape(shape: Sequence[int], dim: int, keepdim: bool) -> Shape:
    if not 0 <= dim < len(shape):
        raise MapError(f"dim {dim} is out of range for a rank-{len(shape)} tile")
    if keepdim:
        return tuple(1 if i == dim else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i != dim)


def matmul_shape(a: Sequence[int], b: Sequence[int], transpose_b: bool) -> Shape:
    """a[..., m, k] x b[..., k, n] (or b[..., n, k] with transpose_b), batch dims broadcast."""
    if len(a) < 2 or len(b) < 2:
        raise MapError(f"operands must have rank >= 2, got {shape_str(a)} and {shape_str(b)}")
    k_b, n = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    if a[-1] != k_b:
        layout = "b is [n, k]" if transpose_b else "b is [k, n]"
        raise MapError(
            f"inner dimensions differ: a is {shape_str(a)}, b is {shape_str(b)} ({layout})"
        )
    batch = broadcast_shapes(a[:-2], b[:-2])
    if batch is None:
        raise MapError(f"batch dims do not broadcast: a is {shape_str(a)}, b is {shape_str(b)}")
    return (*batch, a[-2], n)
