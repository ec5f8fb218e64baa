"""Near-ties of nn.argmax in the reference: recorded per row, forced, searched fewest first."""

from __future__ import annotations

import numpy as np

from mk.interp.nn_ties import ArgmaxSteer, search_ties


def test_steer_records_near_ties_and_forces_choices() -> None:
    x = np.array([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 0.0, 0.0], [2.0, 0.0, 2.01, 0.0]])
    steer = ArgmaxSteer(0.05, {(0, 0): 2})
    chosen = steer.choose(x, -1, step=3)
    assert chosen.tolist() == [2, 0, 2] and chosen.dtype == np.int32
    assert [(s.row, s.candidates, s.step) for s in steer.sites] == [(0, (1, 2), 3), (2, (2, 0), 3)]
    assert steer.sites[0].margin == 0.0 and 0 < steer.sites[1].margin < 0.05
    assert steer.choose(x.T, 0, step=4).tolist() == [1, 0, 2]  # a second evaluation: not forced
    assert steer.evaluations == 2


def test_steer_without_margin_is_plain_argmax() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    steer = ArgmaxSteer(0.0)
    assert np.array_equal(steer.choose(x, 1, step=0), np.argmax(x, axis=1))
    assert steer.sites == []


def test_search_tries_fewest_changed_choices_first() -> None:
    """Two independent tied rows: the single change that matches is found before any pair."""
    x = np.array([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0]])
    tried: list[dict[tuple[int, int], int]] = []

    def matches(steer: ArgmaxSteer) -> bool:
        tried.append(dict(steer.forced))
        return steer.choose(x, -1, step=0).tolist() == [0, 2]

    found = search_ties(matches, 0.05, max_runs=8)
    assert found is not None and found.forced == {(0, 1): 2}
    assert tried == [{}, {(0, 0): 1}, {(0, 1): 2}]
    assert search_ties(lambda s: s.choose(x, -1, step=0).tolist() == [2, 0], 0.05, 8) is None
