"""A one-line progress bar on stderr, shown only when stderr is a terminal or when asked."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """`[superoptimize @f] 3.1/15.0 s ████░░░░ 12345 states, 6 graphs`, redrawn in place."""

    def __init__(
        self, label: str, budget_s: float, enabled: bool | None = None, stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.budget_s = label, budget_s
        self.start = time.monotonic()
        self._last = 0.0

    def update(self, states: int, graphs: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.2):
            return
        self._last = now
        spent = now - self.start
        filled = min(20, int(20 * spent / self.budget_s)) if self.budget_s > 0 else 20
        bar = "█" * filled + "░" * (20 - filled)
        self.stream.write(
            f"\r[superoptimize {self.label}] {spent:5.1f}/{self.budget_s:.1f} s {bar} "
            f"{states} states, {graphs} graphs"
        )
        self.stream.flush()

    def close(self, states: int, graphs: int) -> None:
        if self.enabled:
            self.update(states, graphs, force=True)
            self.stream.write("\n")
            self.stream.flush()
