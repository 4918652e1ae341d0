"""What the engine source keeps of a scrape reads exactly like the whole scrape."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.exposition import compact, read

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "engines").glob("*.prom"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_compact_reads_the_same(path):
    text = path.read_text()
    small = compact(text)
    assert len(small) < len(text)
    assert read(small) == read(text)


def test_garbage_is_kept_whole_for_the_reason():
    for text in ("<html>oops</html>", "", "node_cpu_seconds_total 5\n"):
        assert compact(text) == text
        assert read(compact(text)) == read(text)


def test_vllm_scrape_shrinks_tenfold():
    text = (Path(__file__).parent / "fixtures/engines/vllm-0.33.0-statlogger.prom").read_text()
    # what is kept is mostly the four latency histograms (queue, TTFT, ITL, E2E)
    assert len(compact(text)) * 3 < len(text)
