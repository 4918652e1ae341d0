"""Window edges and histogram_quantile interpolation inside inner buckets."""

from __future__ import annotations

import math

import pytest

try:  # where the windows live differs between versions of the layout
    from gpuwatch.signals.windows import Window, histogram_quantile
except ImportError:
    from gpuwatch.engines.windows import Window, histogram_quantile

INF = math.inf


@pytest.mark.parametrize(("q", "bounds", "counts", "expected"), [
    (0.5, (1.0, INF), [2, 2], 0.5),  # two buckets are enough
    (0.5, (1.0, 2.0, INF), [1, 3, 3], 1.25),  # second bucket: starts at the first bound
    (0.75, (1.0, 2.0, INF), [1, 2, 2], 1.5),  # a bucket holding a single observation
    (0.99, (1.0, 2.0, INF), [1, 2, 3], 2.0),  # in +Inf: the highest finite bound
])
def test_histogram_quantile_by_hand(q, bounds, counts, expected):
    assert histogram_quantile(q, bounds, counts) == pytest.approx(expected)


def test_window_keeps_the_newest_snapshot_at_the_start():
    w = Window(10.0)
    for t, v in ((0.0, 0.0), (5.0, 5.0), (10.0, 10.0), (15.0, 30.0)):
        w.push(t, {"x": v})
    # The window starts at 5: the snapshot at exactly 5 is its base, the one at 0 is gone.
    assert w.increase("x") == (25.0, 10.0)
    assert w.base(["x"]) == (5.0, {"x": 5.0})


def test_window_needs_two_snapshots():
    w = Window(10.0)
    w.push(0.0, {"x": 1.0})
    assert w.base(["x"]) is None and w.increase("x") is None
    w.push(1.0, {"y": 1.0})
    assert w.base(["x"]) is None  # the newest snapshot lacks x
