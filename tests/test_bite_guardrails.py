"""Guardrails at their edges: cooldown and rate-window boundaries, the concurrency cap, and
the cooldown table's pruning (bounded, and never dropping a key still in cooldown)."""

from __future__ import annotations

from gpuwatch.remediation import guardrails as guardrails_mod
from gpuwatch.remediation.guardrails import Guardrails

MAX_KEYS = getattr(guardrails_mod, "MAX_COOLDOWN_KEYS", 4096)


def make(now, **kw):
    args = {"cooldown_seconds": 600.0, "rate_limit": 100_000, "rate_window_seconds": 3600.0,
            "max_concurrent": 1000, **kw}
    return Guardrails(clock=lambda: now[0], **args)


def run(g: Guardrails, action: str, target: str) -> None:
    """Admit and start an action (where starting is its own step, the cooldown begins
    there) and let it finish."""
    g.admit(action, target)
    started = getattr(g, "started", None)
    if started is not None:
        started(action, target)
    g.finish()


def test_cooldown_ends_exactly_at_cooldown_seconds():
    now = [1000.0]
    g = make(now)
    run(g, "flush", "a")
    now[0] = 1599.0
    assert g.check("flush", "a") == ("skipped_cooldown", "flush on a ran 599s ago "
                                     "(cooldown 600s)")
    now[0] = 1599.999
    assert g.check("flush", "a")[0] == "skipped_cooldown"
    assert g.check("flush", "b") is None  # per target
    assert g.check("snapshot", "a") is None  # per action
    now[0] = 1600.0
    assert g.check("flush", "a") is None


def test_rate_window_slides_with_an_inclusive_edge():
    now = [0.0]
    g = make(now, cooldown_seconds=0.0, rate_limit=2, rate_window_seconds=60.0)
    run(g, "flush", "a")
    now[0] = 10.0
    run(g, "flush", "b")
    now[0] = 59.9
    result = g.check("flush", "c")
    assert result[0] == "skipped_rate_limit" and "2 actions in the last 60s" in result[1]
    now[0] = 60.0  # the first admission is 60 s old: out of the window
    assert g.check("flush", "c") is None


def test_concurrency_cap_and_finish_never_goes_negative():
    now = [0.0]
    g = make(now, cooldown_seconds=0.0, max_concurrent=2)
    g.admit("flush", "a")
    g.admit("flush", "b")
    assert g.check("flush", "c")[0] == "skipped_rate_limit"
    g.finish()
    assert g.check("flush", "c") is None
    g.admit("flush", "c")  # one finished, one more running: at the cap again
    assert g.in_flight == 2 and g.check("flush", "x")[0] == "skipped_rate_limit"
    g.finish()
    g.finish()
    g.finish()  # one too many: ignored
    g.admit("flush", "c")
    g.admit("flush", "d")
    assert g.in_flight == 2 and g.check("flush", "e")[0] == "skipped_rate_limit"


def test_pruning_keeps_keys_in_cooldown_and_bounds_the_table():
    now = [0.0]
    g = make(now, cooldown_seconds=100.0)
    for i in range(MAX_KEYS):
        run(g, "signal", f"old-{i}")
    now[0] = 150.0
    run(g, "signal", "fresh")  # past the bound: the expired keys go, the fresh one stays
    now[0] = 160.0
    assert g.check("signal", "fresh")[0] == "skipped_cooldown"
    assert g.check("signal", "old-0") is None
    assert len(g._last) <= 2
    # Keys still in cooldown are never pruned, however many there are.
    g2 = make(now, cooldown_seconds=1000.0)
    for i in range(MAX_KEYS + 10):
        run(g2, "signal", f"k-{i}")
    assert all(g2.check("signal", f"k-{i}") for i in (0, MAX_KEYS // 2, MAX_KEYS + 9))


def test_a_reserved_action_blocks_its_twin_until_it_finishes_even_with_a_short_cooldown():
    now = [1000.0]
    g = make(now, cooldown_seconds=0.5)
    g.admit("flush", "a")
    assert g.check("flush", "a") == ("skipped_cooldown", "flush on a is about to run")
    # it finished without running (refused further on): no cooldown, nothing pending
    g.finish("flush", "a")
    assert g.check("flush", "a") is None
    # without a cooldown, twins may run side by side
    g = make(now, cooldown_seconds=0.0)
    g.admit("flush", "a")
    assert g.check("flush", "a") is None
