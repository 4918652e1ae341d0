"""The engine fuzz tests can see an analyzer that raises: the analyzer turns exceptions into
"engine down", and test_engine_fuzz.py's check would let that pass unnoticed without
check_no_internal_failure. Here an exception is planted to show the check fails on it."""

from __future__ import annotations

import pytest

from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.derived import Derived
from tests.test_engine_fuzz import check_no_internal_failure

try:  # where the analyzer lives differs between versions of the layout
    from gpuwatch.signals.engine import EngineAnalyzer
except ImportError:
    from gpuwatch.engines.analyzer import EngineAnalyzer


def test_the_fuzz_check_sees_an_analyzer_that_raises(monkeypatch):
    from gpuwatch.exposition import common

    def boom(*a, **kw):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(common, "set_gauge", boom)
    derived = Derived()
    text = 'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
    events = EngineAnalyzer().update(
        Tick(t=0.0, engines=[EngineSample(name="e", kind="vllm", url="u", exposition=text,
                                          t=0.0)]), derived, Conditions())
    with pytest.raises(AssertionError, match="planted"):
        check_no_internal_failure(derived.engines["e"], events)
