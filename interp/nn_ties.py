"""Near-ties of nn.argmax in the reference: recorded, and steered to another near-tied choice."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np

# (evaluation of an nn.argmax in run order, flat row of that evaluation) -> the index it returns
Choices = dict[tuple[int, int], int]


@dataclass(frozen=True)
class TieSite:
    """One row of one nn.argmax evaluation whose best values lie within the tie margin."""

    evaluation: int
    step: int  # the decode step (`nn.steps`) it ran in
    row: int
    candidates: tuple[int, ...]  # best first; the first is what argmax returns
    margin: float  # top-1 minus top-2, in units of the row's rms

    @property
    def key(self) -> tuple[int, int]:
        return (self.evaluation, self.row)


@dataclass
class ArgmaxSteer:
    """Set as `argmax_steer` while the reference runs: each nn.argmax records its near-ties and
    returns the forced choice where `forced` names one."""

    tie_margin: float  # in units of each row's rms
    forced: Choices = field(default_factory=Choices)
    sites: list[TieSite] = field(default_factory=list[TieSite])
    evaluations: int = 0

    def choose(self, x: np.ndarray, dim: int, step: int) -> np.ndarray:
        """The argmax of `x` along `dim`, recording near-ties and applying forced choices."""
        rows = np.moveaxis(np.asarray(x, np.float64), dim, -1)
        flat = rows.reshape(-1, rows.shape[-1])
        chosen = np.argmax(flat, axis=-1)
        evaluation = self.evaluations
        self.evaluations += 1
        if flat.shape[-1] >= 2 and flat.shape[0]:
            self._record(flat, chosen, evaluation, step)
        for (e, row), index in self.forced.items():
            if e == evaluation:
                chosen[row] = index
        return chosen.reshape(rows.shape[:-1]).astype(np.int32)

    def _record(self, flat: np.ndarray, chosen: np.ndarray, evaluation: int, step: int) -> None:
        """A site for every row with more than one value within the margin of its best."""
        rms = np.sqrt(np.mean(flat * flat, axis=-1))
        best = np.take_along_axis(flat, chosen[:, None], axis=-1)[:, 0]
        with np.errstate(invalid="ignore"):
            near = flat >= (best - self.tie_margin * rms)[:, None]
        for row in np.flatnonzero((near.sum(axis=-1) > 1) & np.isfinite(best)):
            values = flat[row]
            tied = np.flatnonzero(near[row])
            order = tied[np.argsort(-values[tied], kind="stable")]
            margin = float(values[order[0]] - values[order[1]]) / max(float(rms[row]), 1e-30)
            candidates = tuple(int(i) for i in order)
            self.sites.append(TieSite(evaluation, step, int(row), candidates, margin))


argmax_steer: ContextVar[ArgmaxSteer | None] = ContextVar("argmax_steer", default=None)


def search_ties(
    matches: Callable[[ArgmaxSteer], bool], tie_margin: float, max_runs: int
) -> ArgmaxSteer | None:
    """The steer of the first reference run that `matches` accepts, or None.

    Runs first with no forced choice, then breadth-first over forced choices: fewest changed
    near-ties first, each later in run order than the ones already forced, since a changed choice
    changes every value after it (and so the near-ties found there). At most `max_runs` runs.
    """
    queue: deque[Choices] = deque([{}])
    for _ in range(max_runs):
        if not queue:
            return None
        forced = queue.popleft()
        steer = ArgmaxSteer(tie_margin, dict(forced))
        if matches(steer):
            return steer
        last = max(forced, default=(-1, -1))
        for site in steer.sites:
            if site.key > last:
                queue.extend({**forced, site.key: c} for c in site.candidates[1:])
    return None
