"""The metric alias table: every alias sourced and present in a fixture, every dialect read
the same, no exposition with a family the table calls removed, unread families listed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuwatch.exposition import MODULES, aliases, compact, read
from gpuwatch.exposition.parse import SUFFIXES

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
# fixtures whose name carries the engine version: <kind>-<version>-....prom
VERSIONED = sorted(p for p in FIXTURES.glob("*.prom")
                   if re.match(r"(vllm|triton|llamacpp|sglang)-\d", p.name))
KIND_OF = {"vllm": "vllm", "triton": "triton", "llamacpp": "llamacpp", "sglang": "sglang"}


def test_every_alias_has_a_source_and_a_fixture_that_carries_it():
    assert set(aliases.TABLES) >= {"vllm", "nim", "sglang", "triton", "llamacpp", "tgi"}
    for kind, table in aliases.TABLES.items():
        for a in table:
            assert a.role in aliases.ROLES, a
            assert a.source, a
            if not a.fixture:
                assert a.removed, f"{a.name}: only a removed name may lack a fixture"
                continue
            body = (FIXTURES / a.fixture).read_text()
            written = {a.name, a.name.replace("sglang:", "sglang_"), a.name.removeprefix("vllm:")}
            lines = {m.group(1) for m in re.finditer(r"^([^#\s{]+)", body, re.M)}
            assert any(n + s in lines for n in written for s in SUFFIXES), \
                f"{kind}: {a.name} not in {a.fixture}"


def test_the_table_covers_the_renames():
    assert aliases.names("vllm", "kv_usage") == ["vllm:kv_cache_usage_perc",
                                                 "vllm:gpu_cache_usage_perc"]
    assert aliases.names("vllm", "itl") == ["vllm:inter_token_latency_seconds",
                                            "vllm:time_per_output_token_seconds"]
    tpot = aliases.alias("vllm", "vllm:time_per_output_token_seconds")
    assert tpot.removed == "0.13" and "#24110" in tpot.source
    assert aliases.alias("vllm", "vllm:gpu_prefix_cache_hits").removed == "0.12"
    assert {a.name for a in aliases.NIM} >= {"gpu_cache_usage_perc", "num_requests_running",
                                             "time_to_first_token_seconds"}
    assert any(a.name.startswith("nv_trt_llm_") for a in aliases.TRITON)
    assert all("#" in a.source for a in aliases.SGLANG if a.role in ("ttft", "e2e"))


def test_every_name_an_engine_module_reads_is_in_its_table():
    for kind, module in MODULES.items():
        table = {a.name for a in aliases.TABLES[kind]}
        read_bases = {aliases.family(n) for n in module.WANTED}
        read_bases -= {"process_start_time_seconds", "vllm:num_requests_swapped"}
        # sglang's prompt_tokens doubles as its prefix-cache query count
        assert read_bases <= table | {aliases.family(n) for n in table}, \
            f"{kind}: {sorted(read_bases - table)} not in the alias table"


def strip(reading):
    reading.generation = ""
    reading.notes = []
    reading.unread_families = []
    return reading


@pytest.mark.parametrize("name", ["sglang-underscore.prom", "sglang-underscore-later.prom"])
def test_both_sglang_separators_read_the_same(name):
    underscore = (FIXTURES / name).read_text()
    colon = underscore.replace("\nsglang_", "\nsglang:").replace(" sglang_", " sglang:")
    assert "sglang:" in colon and "sglang_" not in colon.split("\n", 1)[1]
    a, why = read(underscore)
    assert a is not None, why
    assert a.generation == "sglang_" and "sglang_ separator" in " ".join(a.notes)
    assert a.requests_running == 5 and a.kv_cache_usage_ratio == 0.4
    b, _ = read(colon)
    assert strip(a) == strip(b)
    assert read(compact(underscore)) == read(underscore)


def test_nim_is_read_as_vllm():
    body = (FIXTURES / "nim-llm-1.x.prom").read_text()
    r, why = read(body)
    assert r is not None, why
    assert (r.kind, r.generation) == ("vllm", "nim")
    assert (r.requests_running, r.requests_waiting, r.kv_cache_usage_ratio) == (4, 2, 0.3)
    assert r.sli_source["ttft"] == "vllm:time_to_first_token_seconds"
    assert read(compact(body)) == read(body)
    # a plain exporter's num_* names are not taken for NIM when vLLM's own are there
    assert aliases.dialect("vllm:num_requests_running 1\nnum_requests_running 2\n") == ""


def test_current_names_win_over_deprecated_ones():
    body = (FIXTURES / "vllm-0.11-deprecated.prom").read_text()
    body = body.replace('vllm:gpu_cache_usage_perc{engine="0",', 'vllm:gpu_cache_usage_perc{x="",')
    r, _ = read(body.replace("vllm:gpu_cache_usage_perc{x=\"\",model_name=\"meta-llama/Llama-"
                             "3.1-8B-Instruct\"} 0.25", "vllm:gpu_cache_usage_perc 0.99"))
    assert r.kv_cache_usage_ratio == 0.25
    assert r.sli_source["itl"] == "vllm:inter_token_latency_seconds"


@pytest.mark.parametrize("path", VERSIONED, ids=lambda p: p.name)
def test_no_exposition_has_a_family_the_table_calls_removed(path):
    kind = KIND_OF[path.name.split("-")[0]]
    version = path.name.split("-")[1]
    body = path.read_text()
    fams = aliases.declared(body, kind) | {
        aliases.family(m.group(1)) for m in re.finditer(r"^([^#\s{]+)", body, re.M)}
    assert aliases.removed_in(kind, fams, version) == []


def test_the_removed_check_can_fail():
    body = (FIXTURES / "vllm-0.11-deprecated.prom").read_text()
    fams = aliases.declared(body, "vllm")
    assert aliases.removed_in("vllm", fams, "0.11") == []
    assert aliases.removed_in("vllm", fams, "0.12.1") == [
        "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hits",
        "vllm:gpu_prefix_cache_queries"]
    assert "vllm:time_per_output_token_seconds" in aliases.removed_in("vllm", fams, "0.13.0")


def test_unread_families_are_listed_and_bounded():
    body = (FIXTURES / "vllm-0.33.0-statlogger.prom").read_text()
    r, _ = read(body)
    assert "vllm:num_requests_waiting_by_reason" not in r.unread_families
    assert "vllm:estimated_flops_per_gpu" in r.unread_families
    assert "vllm:engine_sleep_state" not in r.unread_families  # read since: a memory fact
    assert "vllm:time_to_first_token_seconds" not in r.unread_families
    assert "vllm:kv_cache_usage_perc" not in r.unread_families
    assert read(compact(body))[0].unread_families == r.unread_families
    flood = body + "".join(f"# TYPE vllm:new_{i}_{'x' * 150} gauge\nvllm:new_{i} 1\n"
                           for i in range(20_000))
    flood += "".join(f"# TYPE vllm:{i}_{'y' * 300} gauge\n" for i in range(100))
    r, _ = read(flood)
    assert len(r.unread_families) == aliases.MAX_FAMILIES + 1
    assert r.unread_families[-1].startswith("...")
    assert all(len(f) <= 200 and "yyy" not in f for f in r.unread_families)


def test_dialect_renaming_reads_a_big_body():
    # its cost: benchmarks/hostile_input_cost.py
    rows = "".join(f'num_requests_running{{model_name="m{i}"}} 1\n' for i in range(200_000))
    text, d = aliases.canonical(rows)
    assert d == "nim" and text.startswith("vllm:num_requests_running")
    assert text.count("\nvllm:num_requests_running{") == 200_000 - 1
