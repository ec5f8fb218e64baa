"""How many positions a prefill program runs: the prompt's, or a few more that cut better."""

from __future__ import annotations

from typing import Any

from mk.models.build import prefill_program
from mk.models.config import ModelConfig
from mk.passes.nn_to_mugraph_rules import rows_cut_well

# Rows modelled beyond the prompt's: an eighth of them, at least this many.
MIN_SLACK = 16


def prefill_rows(
    config: ModelConfig,
    batch: int,
    length: int,
    context: int,
    target: str | None = None,
    **pass_options: Any,
) -> int:
    """The positions a prefill of `length` prompt positions runs, below `context`.

    The compiler cuts a prefill's rows into blocks at divisors of their count; a count that
    none cuts near 64 rows (997, a prime) would run every kernel as one block of all of them,
    so such a count takes the fewest more that one cuts (997 -> 999 = 9 x 111). With `target`
    the candidates also include every multiple of 8 up to an eighth more rows, and the one whose
    one-layer program the cost model gives the least time, as mk.compile would lower it for
    `target` with `pass_options`, wins: on the CUDA target whole waves of blocks matter more
    than the rows (999 positions of qwen3-0.6b take 288 gemm tiles of q/k/v, three waves of 132
    SMs; 1,008 take 256, two). Ties go to fewer rows. The extra rows repeat the prompt's next
    token at the positions after it (prefill_inputs); their K/V rows land in cache slots that
    the decode steps write before any step reads them."""
    from mk.compiler import mugraph_estimate

    limit = context - 1
    first = next((r for r in range(length, limit + 1) if rows_cut_well(r)), None)
    if first is None:
        return length
    if target is None:
        return first
    top = min(limit, length + max(MIN_SLACK, length // 8))
    candidates = sorted({first, *(r for r in range(-(-length // 8) * 8, top + 1, 8))})
    one_layer = config.with_(layers=1)

    def estimate(rows: int) -> float:
        text = prefill_program(one_layer, batch, rows, context)
        return mugraph_estimate(text, target, **pass_options)

    return min((r for r in candidates if rows_cut_well(r)), key=lambda r: (estimate(r), r))
