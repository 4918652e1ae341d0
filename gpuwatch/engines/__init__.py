"""Inference-engine collectors: find, scrape, bound (the I/O side).

- `gpuwatch.sources.engines.EngineSource` scrapes every endpoint (configured, `--engine URL`,
  or discovered by `discovery`) into EngineSamples: raw text or the error, both recorded.
- `body.prepare()` turns a body into the text to record and its reading, in the source's
  reader processes (bounded decompression, `max_series`, `max_series_groups`).

What an exposition means is pure and lives in `gpuwatch.exposition`: `read()` recognizes the
engine (`detect`), keeps the lines it needs (`parse`) and maps vLLM (V1 >= 0.9, V1 <= 0.8,
V0), SGLang, TGI, llama.cpp or Triton onto one `Reading`, so that replay re-reads recorded
text exactly as the live run did.

The judgement lives with the other signals: `gpuwatch.signals.engine.EngineAnalyzer` turns
readings into `derived.engines[name]` (`signals.derived.EngineState`): gauges, restart-proof
counters and windowed hit ratio, queue-time quantiles and preemption rate
(`gpuwatch.signals.windows`), plus the engine_down, kv_cache_hit_ratio and queue_latency
events. Anything an engine does not expose stays None, and `missing` says why.
"""
