"""The engine path under fuzzing must not fail *inside*: the analyzer turns any exception
into "engine down" (a sample must never take the daemon down), which hid its own bugs from
the finiteness checks of test_engine_fuzz.py. Here an internal failure is a test failure."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from tests.test_engine_fuzz import check_state, exposition

try:  # where the analyzer lives differs between versions of the layout
    from gpuwatch.signals.engine import EngineAnalyzer
except ImportError:
    from gpuwatch.engines.analyzer import EngineAnalyzer

# What the analyzer says when read() or normalizing raised.
INTERNAL = ("could not read the exposition", "could not normalize")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(exposition(), st.sampled_from(["auto", "vllm", "sglang", "tgi",
                                                          "llamacpp", "triton"])),
                min_size=1, max_size=6))
def test_no_exception_hides_behind_engine_down(seq):
    analyzer = EngineAnalyzer()
    derived, conditions = Derived(), Conditions()
    for i, (text, kind) in enumerate(seq):
        sample = EngineSample(name="e", kind=kind, url="u", exposition=text, t=float(i))
        events = analyzer.update(Tick(t=float(i), engines=[sample]), derived, conditions)
        st_ = derived.engines["e"]
        assert not st_.reason.startswith(INTERNAL), st_.reason
        check_state(st_)
        for ev in events:  # nothing fires on a value that is not a finite number
            assert ev.value is None or (ev.value == ev.value and abs(ev.value) < 1e300), ev


def test_the_check_sees_an_analyzer_that_raises(monkeypatch):
    """The property above can fail: an analyzer whose normalizer raises is caught."""
    from gpuwatch.engines.normalize import common

    def boom(*a, **kw):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(common, "set_gauge", boom)
    analyzer = EngineAnalyzer()
    derived = Derived()
    text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1\n"
    analyzer.update(Tick(t=0.0, engines=[EngineSample(name="e", kind="vllm", url="u",
                                                      exposition=text, t=0.0)]),
                    derived, Conditions())
    assert derived.engines["e"].reason.startswith(INTERNAL)
