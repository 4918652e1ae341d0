"""EngineAnalyzer: recorded engine scrapes -> derived.engines and engine events.

Pure: it reads only the Tick (each EngineSample's raw exposition or error) and keeps its
own windows, so `gpuwatch replay` of a recording reproduces the live run exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuwatch.events import Event
from gpuwatch.exposition import common as c
from gpuwatch.exposition import read
from gpuwatch.model import EngineSample, Tick
from gpuwatch.signals import slis
from gpuwatch.signals.conditions import Conditions
from gpuwatch.signals.config import EngineLimits, KvCacheSignalConfig, QueueSignalConfig
from gpuwatch.signals.derived import Derived, EngineState
from gpuwatch.signals.engine_events import judge_kv, judge_queue
from gpuwatch.signals.engine_life import EngineLife
from gpuwatch.signals.windows import EngineCounters, Window

SIGNALS = ("engine_down", "kv_cache_hit_ratio", "queue_latency")
ALL_MISSING_KEYS = (
    c.REQUESTS_RUNNING, c.REQUESTS_WAITING, c.KV_USAGE, c.PREFIX_CACHE, c.KV_HIT_RATIO,
    c.QUEUE_LATENCY, c.QUEUE_MEAN, c.PREEMPTION, *slis.n.MISSING_KEYS,
)


# The longest queue time gpuwatch believes (one day): a quantile or mean above it comes from
# absurd bucket bounds or sums, is left out and never judged.
MAX_QUEUE_SECONDS = 86400.0


def qlabel(q: float) -> str:
    return format(q, "g")


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _seconds(v: float | None) -> float | None:
    return v if v is not None and 0 <= v <= MAX_QUEUE_SECONDS else None


COUNTED = ("prefix_cache_hits_total", "prefix_cache_queries_total", "preemptions_total",
           "queue_requests_total", "queue_seconds_total", "kv_cache_hit_ratio",
           "kv_cache_queries_in_window", "queue_latency_mean_seconds",
           "queue_requests_in_window", "preemption_rate_per_second")


def _clear_counted(st: EngineState) -> None:
    """What is derived from the engine's counters: gone while they cannot be read."""
    for name in COUNTED:
        setattr(st, name, None)
    st.queue_latency_seconds = {}
    slis.clear(st)
    st.models = {}


@dataclass
class _Track:
    """Per-engine memory that is not part of the published state."""

    bank: EngineCounters
    kv: Window
    queue: Window
    life: EngineLife
    last_sample_t: float = 0.0
    has_histogram: bool = False
    sli: Window | None = None
    models: dict[str, Window] = field(default_factory=dict)  # per-model SLI windows


class EngineAnalyzer:
    def __init__(self, config=None) -> None:
        self.configured = {e.name: e for e in (getattr(config, "engines", None) or [])}
        self.discovery = getattr(config, "discovery", None) or EngineLimits()
        signals = getattr(config, "signals", None)
        self.kv_cfg: KvCacheSignalConfig = (
            getattr(signals, "kv_cache", None) or KvCacheSignalConfig()
        )
        self.queue_cfg: QueueSignalConfig = (
            getattr(signals, "queue", None) or QueueSignalConfig()
        )
        self.quantiles = sorted({*self.queue_cfg.quantiles, self.queue_cfg.slo_quantile})
        self.tracks: dict[str, _Track] = {}

    # -- the Analyzer protocol ------------------------------------------------------------

    def update(self, tick: Tick, derived: Derived, conditions: Conditions) -> list[Event]:
        events: list[Event] = []
        touched: dict[str, float] = {}
        for sample in tick.engines:
            t = sample.t if sample.t is not None and math.isfinite(sample.t) else tick.t
            st = derived.engines.get(sample.name)
            if not isinstance(st, EngineState):
                st = derived.engines[sample.name] = EngineState(name=sample.name)
            self._ingest(sample, st, t)
            touched[sample.name] = t
        if tick.gpus:
            self._link_gpus(tick, derived)
        for name in touched:
            events += self._judge(tick.t, derived.engines[name], conditions)
        events += self._forget(tick.t, derived, conditions)
        return events

    # -- ingest ---------------------------------------------------------------------------

    def _limits(self, name: str) -> EngineLimits:
        return self.configured.get(name) or self.discovery

    def _track(self, name: str) -> _Track:
        tr = self.tracks.get(name)
        if tr is None:
            tr = self.tracks[name] = _Track(
                bank=self._bank(name), kv=Window(self.kv_cfg.window_seconds),
                queue=Window(self.queue_cfg.window_seconds),
                life=EngineLife(self.queue_cfg.window_seconds),
            )
        return tr

    def _bank(self, name: str) -> EngineCounters:
        lim = self._limits(name)
        return EngineCounters(lim.max_series_groups, lim.forget_group_after_scrapes)

    def _ingest(self, sample: EngineSample, st: EngineState, t: float) -> None:
        tr = self._track(sample.name)
        tr.last_sample_t = max(tr.last_sample_t, t)
        st.url = sample.url
        st.pids = sorted(set(sample.pids))
        st.last_scrape = t
        st.scrape_duration_seconds = _finite(sample.duration_seconds)
        if sample.kind and sample.kind != "auto" and not st.kind:
            st.kind = sample.kind
        if sample.error:
            self._down(st, sample.error)
            return
        if sample.exposition is None:
            self._down(st, "no exposition in the sample")
            return
        # The live source reads the exposition off the event loop and hands the result
        # along; replay (and the simulator) read the same recorded text here.
        pre = getattr(sample, "reading", None)
        try:
            lim = self._limits(sample.name)
            reading, why = pre if pre is not None else read(
                sample.exposition, sample.kind or "auto", lim.max_series, lim.max_series_groups)
        except Exception as exc:  # a sample must never take the daemon down
            reading, why = None, f"could not read the exposition: {type(exc).__name__}: {exc}"
        if reading is None:
            self._down(st, why)
            return
        try:
            self._up(st, tr, reading, t)
            self._info(st, reading, sample.info)
        except Exception as exc:
            self._down(st, f"could not normalize the exposition: {type(exc).__name__}: {exc}")

    def _down(self, st: EngineState, reason: str) -> None:
        st.up = False
        st.reason = reason[:500]
        st.consecutive_failures += 1
        for name in ("requests_running", "requests_waiting", "kv_cache_usage_ratio",
                     "sleep_level"):
            setattr(st, name, None)
        _clear_counted(st)
        st.unread_families = []
        st.kv_cache_hit_ratio_source = ""
        st.missing = {k: "engine down" for k in ALL_MISSING_KEYS}
        st.replicas = 0

    def _up(self, st: EngineState, tr: _Track, r: c.Reading, t: float) -> None:
        st.up = True
        st.reason = ""
        st.consecutive_failures = 0
        st.last_success = t
        st.kind = r.kind
        st.generation = r.generation
        st.model = r.model
        st.ranks = r.ranks
        st.cache_config = r.cache_config
        st.kv_pool_tokens, st.kv_pool_bytes = r.kv_pool_tokens, r.kv_pool_bytes
        if r.sleep_level is not None and st.sleep_level is not None \
                and (r.sleep_level > 0) != (st.sleep_level > 0):
            st.sleep_changed_at = t  # fell asleep or woke: the memory analyzer holds
            st.sleeps_total += r.sleep_level > 0
        st.sleep_level = r.sleep_level
        st.requests_running = _finite(r.requests_running)
        st.requests_waiting = _finite(r.requests_waiting)
        st.kv_cache_usage_ratio = _finite(r.kv_cache_usage_ratio)
        st.missing = dict(r.missing)
        st.notes = list(r.notes[:20])

        st.models_loaded = r.models_loaded
        restarts = tr.bank.update(r.start_time, r.counters, r.group_models)
        ambiguous, correction = tr.life.observe(t, tr.bank.blind_reset)
        if st.ambiguous and not ambiguous:
            # calm for a window: count afresh from this scrape, nothing of the flapping kept
            tr.bank = self._bank(st.name)
            restarts = tr.bank.update(r.start_time, r.counters, r.group_models)
        st.restarts_detected = max(st.restarts_detected + restarts + correction, 0)
        st.restarts_total = tr.life.publish(st.restarts_detected)
        st.series_groups = tr.bank.groups()
        refused = tr.bank.refused + r.groups_left_out
        st.limit = (
            f"{refused} series group(s) of this scrape refused: the engine is at its cap of "
            f"{tr.bank.max_groups} (max_series_groups)" if refused else ""
        )
        st.replicas = tr.bank.replicas()
        if st.replicas > 1:
            st.reason = (
                f"{st.replicas} processes answer at this URL (process_start_time_seconds "
                "alternates): counters are summed per process, gauges are the last answer's"
            )
        st.ambiguous = ambiguous
        if ambiguous:
            self._ambiguous(st, tr)
            return
        totals = tr.bank.totals()
        tr.kv.push(t, {k: totals[k] for k in (c.PREFIX_HITS, c.PREFIX_QUERIES) if k in totals})
        tr.queue.push(t, {
            k: v for k, v in totals.items()
            if k.startswith(c.QUEUE_LE) or k in (c.QUEUE_COUNT, c.QUEUE_SUM, c.PREEMPTIONS)
        })

        def total(name: str) -> float | None:
            return _finite(totals.get(name)) if r.has_counter(name) else None

        st.prefix_cache_hits_total = total(c.PREFIX_HITS)
        st.prefix_cache_queries_total = total(c.PREFIX_QUERIES)
        st.prefix_cache_unit = r.prefix_unit if st.prefix_cache_queries_total is not None else ""
        st.preemptions_total = total(c.PREEMPTIONS)
        st.queue_requests_total = total(c.QUEUE_COUNT)
        st.queue_seconds_total = total(c.QUEUE_SUM)
        self._hit_ratio(st, tr, r)
        self._queue(st, tr, r)
        if tr.sli is None:
            tr.sli = Window(self.queue_cfg.window_seconds)
        slis.update(st, tr.sli, r, totals, t, self.quantiles)
        st.unread_families = list(r.unread_families)
        slis.update_models(st, tr.models, tr.bank.totals_by_model(), r, t, self.quantiles,
                           self.queue_cfg.window_seconds)

    @staticmethod
    def _info(st: EngineState, r: c.Reading, info: dict[str, str]) -> None:
        """What the engine's info endpoint says: its version, and the model where its
        metrics do not name it (llama.cpp)."""
        st.version = str(info.get("version", ""))[:64]
        if not st.model and not r.model_label and info.get("model"):
            st.model = str(info["model"])[:c.MAX_MODEL_CHARS]

    def _ambiguous(self, st: EngineState, tr: _Track) -> None:
        """Counters of an ambiguous endpoint are fabricated: nothing is derived from them,
        and no window keeps them for when it is calm again. (Its bank still sees them: that
        is how the flapping is seen to go on.)"""
        st.reason = tr.life.why()
        tr.kv, tr.queue = Window(tr.kv.seconds), Window(tr.queue.seconds)
        tr.sli, tr.models = None, {}
        _clear_counted(st)
        for key in (c.PREFIX_CACHE, c.KV_HIT_RATIO, c.QUEUE_LATENCY, c.QUEUE_MEAN, c.PREEMPTION,
                    *slis.n.MISSING_KEYS):
            st.missing[key] = "ambiguous endpoint: " + st.reason.split(":", 1)[0]

    def _hit_ratio(self, st: EngineState, tr: _Track, r: c.Reading) -> None:
        w = self.kv_cfg.window_seconds
        st.kv_cache_hit_ratio = None
        st.kv_cache_hit_ratio_source = ""
        st.kv_cache_queries_in_window = None
        if c.KV_HIT_RATIO in r.missing:
            return
        if r.has_counter(c.PREFIX_QUERIES) and r.has_counter(c.PREFIX_HITS):
            base = tr.kv.base([c.PREFIX_HITS, c.PREFIX_QUERIES])
            if base is None:
                st.missing[c.KV_HIT_RATIO] = "needs a second scrape"
                return
            last = tr.kv.latest
            dq = max(last[c.PREFIX_QUERIES] - base[1][c.PREFIX_QUERIES], 0.0)
            dh = max(last[c.PREFIX_HITS] - base[1][c.PREFIX_HITS], 0.0)
            st.kv_cache_queries_in_window = dq
            if dq <= 0:
                st.missing[c.KV_HIT_RATIO] = f"no prefix-cache queries in the last {w:g}s"
                return
            ratio = _finite(min(dh / dq, 1.0))
            if ratio is None:
                st.missing[c.KV_HIT_RATIO] = "counters out of range"
                return
            st.kv_cache_hit_ratio = ratio
            st.kv_cache_hit_ratio_source = "window"
        elif r.hit_ratio_gauge is not None:
            st.kv_cache_hit_ratio = r.hit_ratio_gauge
            st.kv_cache_hit_ratio_source = "engine"
            st.notes.append(f"kv_cache_hit_ratio: {r.hit_ratio_gauge_note}")
        else:
            st.missing.setdefault(c.KV_HIT_RATIO, "no prefix-cache metrics in this scrape")

    def _queue(self, st: EngineState, tr: _Track, r: c.Reading) -> None:
        w = self.queue_cfg.window_seconds
        st.queue_latency_seconds = {}
        st.queue_latency_mean_seconds = None
        st.queue_requests_in_window = None
        st.preemption_rate_per_second = None
        tr.has_histogram = bool(r.queue_bounds)
        if r.queue_bounds:
            names = [c.bucket_name(b) for b in r.queue_bounds]
            base = tr.queue.base(names)
            if base is None:
                st.missing[c.QUEUE_LATENCY] = "needs a second scrape"
            else:
                last = tr.queue.latest
                deltas = [max(last[n] - base[1][n], 0.0) for n in names]
                st.queue_requests_in_window = deltas[-1]
                if deltas[-1] <= 0:
                    st.missing[c.QUEUE_LATENCY] = f"no request left the queue in the last {w:g}s"
                else:
                    for q in self.quantiles:
                        v, _ = slis.quantile(q, r.queue_bounds, deltas)
                        if _seconds(v) is not None:
                            st.queue_latency_seconds[qlabel(q)] = v
                        elif v is not None:
                            st.missing[c.QUEUE_LATENCY] = (
                                f"p{q * 100:g} of {v:.3g}s is beyond {MAX_QUEUE_SECONDS:g}s: "
                                "the bucket bounds are not sane"
                            )
        if r.has_counter(c.QUEUE_SUM) and r.has_counter(c.QUEUE_COUNT):
            base = tr.queue.base([c.QUEUE_SUM, c.QUEUE_COUNT])
            if base is not None:
                last = tr.queue.latest
                n = max(last[c.QUEUE_COUNT] - base[1][c.QUEUE_COUNT], 0.0)
                s = max(last[c.QUEUE_SUM] - base[1][c.QUEUE_SUM], 0.0)
                if st.queue_requests_in_window is None:
                    st.queue_requests_in_window = n
                if n > 0:
                    st.queue_latency_mean_seconds = _seconds(s / n)
                else:
                    st.missing.setdefault(
                        c.QUEUE_MEAN, f"no request left the queue in the last {w:g}s")
            else:
                st.missing.setdefault(c.QUEUE_MEAN, "needs a second scrape")
        else:
            st.missing.setdefault(c.QUEUE_MEAN, "no queue-time sum and count in this scrape")
        if r.has_counter(c.PREEMPTIONS):
            inc = tr.queue.increase(c.PREEMPTIONS)
            if inc is not None and inc[1] > 0:
                st.preemption_rate_per_second = _finite(inc[0] / inc[1])

    # -- GPUs, events, forgetting ---------------------------------------------------------

    def _link_gpus(self, tick: Tick, derived: Derived) -> None:
        states = [st for st in derived.engines.values() if isinstance(st, EngineState)]
        # only the engines' pids are looked for: a host has hundreds of processes
        wanted = {pid for st in states for pid in st.pids}
        owner: dict[int, list[tuple[str, int]]] = {}
        if wanted:
            for g in tick.gpus:
                for p in g.processes:
                    if p.pid in wanted:
                        owner.setdefault(p.pid, []).append((g.uuid, g.index))
        for st in states:
            st.gpus = {u: i for pid in st.pids for u, i in owner.get(pid, [])}

    def _down_after(self, name: str) -> int:
        cfg = self.configured.get(name)
        return cfg.down_after_failures if cfg else self.discovery.down_after_failures

    def _judge(self, t: float, st: EngineState, conditions: Conditions) -> list[Event]:
        name = st.name
        events: list[Event] = []
        need = self._down_after(name)
        down = None
        if not st.up and st.consecutive_failures >= need:
            down = Event(
                t=t, signal="engine_down", state="firing", severity="critical", engine=name,
                value=float(st.consecutive_failures), threshold=float(need),
                message=f"engine {name} down after {st.consecutive_failures} failed "
                        f"scrape(s): {st.reason}",
            )
        events += conditions.set(t, down, ("engine_down", None, None, name))
        if st.up:
            events += judge_kv(self.kv_cfg, t, st, conditions)
            tr = self.tracks.get(st.name)
            events += judge_queue(self.queue_cfg, t, st, conditions,
                                  bool(tr and tr.has_histogram))
        elif down is not None:
            # Its other conditions cannot be judged any more; engine_down says why.
            events += conditions.set(t, None, ("kv_cache_hit_ratio", None, None, name))
            events += conditions.set(t, None, ("queue_latency", None, None, name))
        return events

    def _forget(self, t: float, derived: Derived, conditions: Conditions) -> list[Event]:
        limit = self.discovery.forget_after_seconds
        gone = {
            name for name, tr in self.tracks.items() if t - tr.last_sample_t > limit
        }
        if not gone:
            return []
        for name in gone:
            del self.tracks[name]
            derived.engines.pop(name, None)
        return conditions.retain(t, lambda key: not (key[0] in SIGNALS and key[3] in gone))
