"""The daemon: one asyncio loop that samples, analyzes, records and serves.

Sampling is decoupled from serving: NVML calls run on threads of their own, engines are scraped
by their own tasks, and every fast tick publishes a new immutable Snapshot that /metrics
renders. A source that fails marks only itself down; nothing here dies on a sample.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
from typing import TYPE_CHECKING, Any

from gpuwatch import __version__, exitcodes, lifecycle, logfmt, redact
from gpuwatch import config as config_mod
from gpuwatch.attribution.source import make_source as make_attribution
from gpuwatch.config import Config, ConfigError, WebConfigError
from gpuwatch.engine_feed import EngineFeed
from gpuwatch.events import ActionEvent, Event, to_json
from gpuwatch.exporter.app import make_app
from gpuwatch.exporter.listener import Limits, Listener
from gpuwatch.exporter.render import Renderer
from gpuwatch.exporter.server import Server
from gpuwatch.exporter.snapshot import Snapshot, SourceStatus
from gpuwatch.model import EngineSample, GpuSample, OomSample, ProbeSample, Tick
from gpuwatch.probe_channel.config import resolve_dir
from gpuwatch.ratelog import RateLimitedLog
from gpuwatch.remediation.paths import snapshot_dir
from gpuwatch.remediation.remediator import state_dir
from gpuwatch.signals.pipeline import Pipeline
from gpuwatch.sources.probe_fs import UserFilesystems
from gpuwatch.sources.probes import ProbeReader, prepare_probe_dir
from gpuwatch.sources.sampler import GpuSampler, make_backend
from gpuwatch.thresholds import ThresholdsError

if TYPE_CHECKING:
    import ssl

    from gpuwatch import webconfig
    from gpuwatch.eventslog import EventsLog
    from gpuwatch.recording import Recorder
    from gpuwatch.sources.oom_records import OomReader

log = logging.getLogger("gpuwatch")

RECENT_EVENTS = 200
RELOAD_TIMEOUT_SECONDS = 5.0
# Freed memory goes back to the kernel this often (and after the first tick).
TRIM_HEAP_EVERY_SECONDS = 60.0


class Daemon:
    def __init__(self, cfg: Config, config_path: str | None = None,
                 overrides: dict[str, Any] | None = None,
                 web: webconfig.WebConfig | None = None) -> None:
        redact.remember(cfg)
        self.config = cfg
        self.web = web
        self.guard: webconfig.Guard | None = None
        self.config_path = config_path
        self.overrides = overrides or {}
        self.host = cfg.host_name or socket.gethostname()
        self.started = time.time()
        self.sources: dict[str, SourceStatus] = {"nvml": SourceStatus()}
        self.backend = make_backend(cfg)
        self.sampler = GpuSampler(self.backend, self.sources["nvml"],
                                  cfg.nvml.retry_max_seconds)
        self.pipeline = Pipeline.from_config(cfg)
        self.attribution = make_attribution(cfg, self.backend, self.sources)
        self.nvsentinel = None
        self._make_nvsentinel(cfg)
        self.recent: collections.deque[Event | ActionEvent] = collections.deque(
            maxlen=RECENT_EVENTS)
        self.snapshot = Snapshot(started=self.started, config=cfg)
        self._version = 0
        self._engine_version = 0  # engine ticks published, for the renderer
        self._last_tick_t = 0.0
        self._acting = asyncio.Lock()
        self.engine_feed = EngineFeed(self.run_tick)
        self._recorder: Recorder | None = None
        self._events_log: EventsLog | None = None
        self._stop = asyncio.Event()
        self._engine_task: asyncio.Task | None = None
        self._reload_task: asyncio.Task | None = None
        self._otlp_task: asyncio.Task | None = None
        self._reload_again = False
        self._reader = lifecycle.DeadlineReader()
        self.listener: Listener | None = None
        self._extras: dict[str, Any] = {"driver_version": ""}
        self.renderer = Renderer()
        # Failures that could repeat every tick: counted, shown in /readyz and the metrics,
        # logged once a minute at most.
        self.tick_health = RateLimitedLog(log, "tick")
        self._record_errors = RateLimitedLog(log, "recording a tick")
        self._render_errors = RateLimitedLog(log, "rendering /metrics")
        self.remediator = None
        self.probe_dir = resolve_dir(cfg.probe.dir)
        self.probe_reader = ProbeReader(self.probe_dir, UserFilesystems(
            self.probe_dir, cfg.probe.user_max_bytes, cfg.probe.user_max_files))
        self.oom_reader: OomReader | None = None  # made when the first probe is read
        self._oom_notes: set[str] = set()
        # the backend makes its own (simulation): no records; None until the first tick
        self._own_probes: bool | None = None
        if cfg.probe.enabled and not cfg.simulate and os.geteuid() == 0:
            # Root's; each user's directory in it is made when their process is on a GPU.
            with contextlib.suppress(OSError):
                prepare_probe_dir(self.probe_dir)

    # -- the tick ---------------------------------------------------------------------
    def _read_probes(self, now: float, gpus: list[GpuSample]) -> tuple[list[ProbeSample],
                                                                         list[str]]:
        """Blocking: the directory is written by users, its cost is theirs to choose."""
        return self.probe_reader.read(now, [p.pid for g in gpus for p in g.processes],
                                      stale_after=self.config.probe.stale_after_seconds)

    def _probe_read_after_sample(self, now: float):
        """The probe directory's read, to run on the sampling thread right after the GPUs
        (no thread of its own each tick); None while the backend may make its own probes."""
        if self._own_probes is not False or not self.config.probe.enabled:
            return None
        return lambda gpus: self._read_probes(now, gpus)

    async def _probes(self, now: float, gpus: list[GpuSample],
                      read: Any = None) -> list[ProbeSample]:
        """read: what the sampling thread's probe read returned (or raised), if it ran."""
        own = self.backend.probes(now)
        self._own_probes = own is not None
        if own is not None:
            return own
        if not self.config.probe.enabled:
            return []
        if isinstance(read, BaseException):
            raise read
        # Off the loop: the directory is written by users, its cost is theirs to choose.
        samples, problems = read or await asyncio.to_thread(self._read_probes, now, gpus)
        st = self.sources.setdefault("probes", SourceStatus())
        st.up, st.last_success, st.reason = True, now, "; ".join(problems[:3])
        return samples

    async def _ooms(self, now: float, gpus: list[GpuSample],
                    probes: list[ProbeSample]) -> list[OomSample]:
        """The OOM records probes left since the last tick, adopted into the snapshot
        directory (off the loop: copies from directories users write)."""
        if not self.config.probe.enabled:
            return []
        if self.oom_reader is None:
            if not probes:
                return []
            # imported only here: the records, their channel and the snapshot hook's copy
            # stay out of a host where no probe ever published
            from gpuwatch.sources.oom_records import OomReader

            self.oom_reader = OomReader(self.probe_dir)
        elif not (probes or self.oom_reader.watching):
            return []
        rem = self.config.remediation
        problems: list[str] = []
        ooms = await asyncio.to_thread(
            self.oom_reader.read, now, gpus, probes, snapshot_dir=snapshot_dir(rem),
            max_total_bytes=rem.snapshot.max_total_bytes, problems=problems)
        for note in problems:
            if note not in self._oom_notes and len(self._oom_notes) < 100:
                self._oom_notes.add(note)
                log.warning("OOM records: %s", note)
        return ooms

    def _take_engines(self, now: float) -> list[EngineSample]:
        sim = getattr(self.backend, "engines", None)
        return sim(now) if sim is not None else []

    async def tick_once(self) -> Tick:
        now = time.time()
        gpus, read = await self.sampler.sample_then(now, self._probe_read_after_sample(now))
        return await self._tick_from(now, gpus, read)

    async def _tick_from(self, now: float, gpus: list[GpuSample], read: Any) -> Tick:
        """The host's tick from its GPU sample (and the probe read that followed it)."""
        if self.attribution is not None:  # pods and jobs, from a slowly refreshed cache
            await self.attribution.update(gpus, now)
            self._extras["gpu_owners"] = self.attribution.gpu_owners
        probes = await self._probes(now, gpus, read)
        ooms = [] if self._own_probes else await self._ooms(now, gpus, probes)
        tick = Tick(t=round(now, 3), gpus=gpus, engines=self._take_engines(now), probes=probes,
                    ooms=ooms)
        await self.run_tick(tick)
        return tick

    async def run_tick(self, tick: Tick) -> None:
        """Analyze, publish and act on one tick: the host's, or engine scrapes as they came."""
        tick.t = max(tick.t, self._last_tick_t)  # one order for the pipeline and the recording
        self._last_tick_t = tick.t
        events = self._process(tick)
        # GPU health to NVSentinel (delivered off the loop), from the host's ticks only
        if self.nvsentinel is not None and not tick.engines_only:
            self.nvsentinel.update(tick.gpus, self.pipeline.derived.gpus, tick.t)
        if self.remediator is not None:
            async with self._acting:  # host and engine ticks act one at a time
                self._log_actions(await self.remediator.on_events(events, self.snapshot))

    def _log_actions(self, actions: list[ActionEvent]) -> None:
        for action in actions:  # logged once, by the ledger that decided it
            self.recent.append(action)
            self._log_event(action)

    def _process(self, tick: Tick) -> list[Event]:
        if self._recorder is not None:
            try:
                self._recorder.write(tick)
                self._record_errors.ok()
            except OSError as exc:
                log.error("recording stopped: %s", exc)
                self._recorder = None
            except Exception as exc:  # this tick's line is lost, not the tick
                self._record_errors.failed(exc)
        t0 = time.perf_counter()
        events = self.pipeline.update(tick)
        if self._events_log is not None:
            self._events_log.retry()
        sig = self.sources.setdefault("signals", SourceStatus())
        sig.up, sig.last_success = True, tick.t
        sig.last_duration_seconds = time.perf_counter() - t0
        sig.errors_total = self.pipeline.errors
        for ev in events:
            self.recent.append(ev)
            log.log(logfmt.level(ev), "%s", logfmt.human_line(ev, with_time=False))
            self._log_event(ev)
        self._extras["driver_version"] = self.backend.driver_version
        if not tick.engines_only:  # the host's ticks: an engine scrape says nothing of them
            self.tick_health.ok()
        self._publish(tick, ready=not tick.engines_only)
        return events

    def _log_event(self, ev: Event | ActionEvent) -> None:
        if self._events_log is not None:
            self._events_log.write(redact.scrub_text(to_json(ev)))

    def _publish(self, tick: Tick | None, ready: bool) -> None:
        self._version += 1
        if tick is not None and tick.engines:
            self._engine_version += 1
        if self.remediator is not None:
            self._extras["remediation"] = self.remediator.counters()
        if self.listener is not None:
            self._extras["http"] = {**self.listener.counters(), "logins_refused": dict(
                self.guard.refused) if self.guard and self.guard.auth else None}
        self._extras["ticks"] = self.tick_health.state()
        if tick is not None and tick.engines_only:
            tick = Tick(t=tick.t, gpus=self.snapshot.tick.gpus, probes=self.snapshot.tick.probes,
                        ooms=self.snapshot.tick.ooms,
                        engines=tick.engines) if self.snapshot.tick else tick
        self.snapshot = Snapshot(
            version=self._version,
            engine_version=self._engine_version,
            tick=tick,
            derived=self.pipeline.derived,
            sources={k: dataclasses.replace(v) for k, v in self.sources.items()},
            active_events=tuple(self.pipeline.active),
            recent_events=tuple(self.recent),
            ready=ready or self.snapshot.ready,
            started=self.started,
            extras=dict(self._extras),
            config=self.config,
        )
        # Render now, off the scrape path, when a scrape is due: a scrape between ticks only
        # copies bytes, and states nobody scrapes are not rendered.
        if self.renderer.due(self.config.nvml.fast_interval_seconds):
            try:
                self.renderer.render_ahead(self.snapshot)
                self._render_errors.ok()
            except Exception as exc:
                self._render_errors.failed(exc)

    async def _tick_loop(self) -> None:
        """The host's ticks, timed by the sampling thread (sampler.start_ticks): each wakes
        the loop once, with its sample ready."""
        loop = asyncio.get_running_loop()
        jobs: collections.deque = collections.deque()
        waiter: list[asyncio.Future | None] = [None]

        def wake() -> None:
            if waiter[0] is not None and not waiter[0].done():
                waiter[0].set_result(None)

        def deliver(job) -> None:
            jobs.append(job)
            wake()
        ticks = self.sampler.start_ticks(
            loop, lambda: self.config.nvml.fast_interval_seconds,
            self._probe_read_after_sample, deliver)
        stopping = asyncio.ensure_future(self._stop.wait())
        stopping.add_done_callback(lambda _: wake())
        first = True
        trim_at = 0.0
        try:
            while not self._stop.is_set():
                if not jobs:
                    waiter[0] = loop.create_future()
                    await waiter[0]
                    continue
                job = jobs.popleft()
                try:
                    gpus, read = self.sampler.take(job)
                    await self._tick_from(job.now, gpus, read)
                except Exception as exc:  # shown in /readyz and gpuwatch_tick_failures_total
                    self.tick_health.failed(exc)
                    self._publish(self.snapshot.tick, ready=False)
                finally:
                    ticks.done()
                if first:  # the summary names the GPUs the first tick found
                    first = False
                    for line in self.summary():
                        log.info("%s", line)
                if time.monotonic() >= trim_at:  # after the first tick, then now and then
                    trim_at = time.monotonic() + TRIM_HEAP_EVERY_SECONDS
                    await asyncio.to_thread(lifecycle.trim_heap)
        finally:
            ticks.stop()
            stopping.cancel()

    # -- engines ----------------------------------------------------------------------
    def _engine_sink(self, sample: EngineSample) -> None:
        self.engine_feed.put(sample)
        st = self.sources.setdefault(f"engine:{sample.name}", SourceStatus())
        st.last_duration_seconds = sample.duration_seconds
        if sample.error:
            st.up, st.reason = False, sample.error
            st.errors_total += 1
        else:
            st.up, st.reason, st.last_success = True, "", sample.t

    def _start_engines(self) -> None:
        if self._engine_task is not None:
            self._engine_task.cancel()
            self._engine_task = None
        if not self.config.engines and not self.config.discovery.enabled:
            return
        from gpuwatch.sources.engines import EngineSource

        source = EngineSource(self.config.engines, self.config.discovery)

        async def run() -> None:
            await asyncio.gather(source.run(self._engine_sink), self.engine_feed.run())
        self._engine_task = asyncio.create_task(run())

    # -- configuration ----------------------------------------------------------------
    def request_reload(self) -> None:
        """SIGHUP: one reload at a time; a storm of signals collapses into one more."""
        if self._reload_task is not None and not self._reload_task.done():
            self._reload_again = True
            return
        self._reload_task = asyncio.create_task(self._reload_loop())

    async def _reload_loop(self) -> None:
        self._reload_again = True
        while self._reload_again:
            self._reload_again = False
            await self.reload()

    async def reload(self) -> bool:
        """Validate the whole new configuration, then apply all of it or none of it."""
        try:
            # Every file is read on a daemon thread, with a deadline: a slow or stuck
            # filesystem must not stall sampling and serving, nor exit (a FIFO is refused by
            # the readers themselves).
            new, web_update, pipeline = await self._reader.run(self._read, RELOAD_TIMEOUT_SECONDS)
            self._apply(new, web_update, pipeline)
        except (TimeoutError, lifecycle.StuckRead) as exc:
            log.error("configuration reload rejected, nothing applied: reading %s, its "
                      "threshold table and web config %s", self.config_path,
                      f"took more than {RELOAD_TIMEOUT_SECONDS}s" if isinstance(
                          exc, TimeoutError) else f"is still stuck: {exc}")
            return False
        except WebConfigError as exc:
            log.error("web config reload rejected, nothing of the configuration applied "
                      "either: %s", exc)
            return False
        except (ConfigError, ThresholdsError, ValueError, OSError) as exc:
            log.error("configuration reload rejected, nothing applied: %s", exc)
            return False
        log.info("configuration reloaded: all of %s applied",
                 self.config_path or "the environment")
        return True

    def _read(self) -> tuple[Config, tuple | None, Pipeline | None]:
        """The new configuration; the web config file's new contents and TLS context when it
        is kept (a changed path needs a restart); a new pipeline when signals or the threshold
        table changed. Runs on a thread: all are file reads."""
        new = config_mod.load(self.config_path, overrides=self.overrides)
        web_update = None
        if self.guard is not None and new.web_config and new.web_config == self.config.web_config:
            from gpuwatch import webconfig

            wc = webconfig.load(new.web_config)
            self.guard.check_update(wc)
            web_update = wc, webconfig.ssl_context(wc)
        pipeline = None
        if (new.signals, new.thresholds) != (self.config.signals, self.config.thresholds):
            pipeline = Pipeline.from_config(new)
        return new, web_update, pipeline

    def _apply(self, new: Config, web_update: tuple | None,
               pipeline: Pipeline | None = None) -> None:
        """Build and check everything the new configuration needs before changing anything;
        the remediator's reconfigure is itself all-or-nothing and the last step that can
        fail."""
        old = self.config
        pipeline = pipeline or self.pipeline
        engines_changed = (new.engines, new.discovery) != (old.engines, old.discovery)
        if new.otlp != old.otlp and otlp_missing(new):
            raise ValueError(otlp_missing(new))
        if self.remediator is not None and (new.remediation, new.webhook) != (
                old.remediation, old.webhook):
            self.remediator.reconfigure(new.remediation, new.webhook)
        redact.remember(new)
        if (new.listen, new.web_config) != (old.listen, old.web_config):
            log.warning("listen address and web_config changes need a restart; still serving "
                        "on %s", old.listen)
        # the budget keeps what it knows (who was judged, who has series) across rebuilds
        pipeline.budget, pipeline.budget.cfg = self.pipeline.budget, new.budget
        if pipeline is not self.pipeline:
            self.pipeline = pipeline
            log.info("signals rebuilt from the new configuration (windows restart)")
        self.config = new
        if engines_changed:
            self._start_engines()
        if (new.attribution, new.proc_root) != (old.attribution, old.proc_root):
            if self.attribution is not None:
                self.attribution.close()
            self.attribution = make_attribution(new, self.backend, self.sources)
        if new.nvsentinel != old.nvsentinel:
            self._make_nvsentinel(new)
        if new.otlp != old.otlp:
            self._start_otlp()
        if web_update is not None:
            self._reload_web(*web_update)

    def _reload_web(self, wc: webconfig.WebConfig, context: ssl.SSLContext | None) -> None:
        try:
            restart = self.guard.update(wc, context)
        except (OSError, WebConfigError) as exc:  # changed since read (ssl.SSLError too)
            log.error("web config reload rejected, keeping the current one: %s", exc)
            return
        if self.listener is not None:
            self.listener.ssl = self.guard.context
        if restart:
            log.warning("web config: %s changes need a restart", ", ".join(restart))
        else:
            log.info("web config reloaded")

    # -- running ----------------------------------------------------------------------
    def _open_outputs(self) -> str | None:
        """Open the recording and the events log; the reason when one cannot be."""
        cfg = self.config
        key = "record"
        # each imported only where it is configured
        try:
            if cfg.record:
                from gpuwatch.recording import Recorder

                self._recorder = Recorder(cfg.record, self.host, cfg.nvml.fast_interval_seconds)
            key = "events_log"
            if cfg.events_log:
                from gpuwatch.eventslog import EventsLog

                self._events_log = EventsLog(cfg.events_log)
        except OSError as exc:
            self._close_outputs()
            return f"{key}: cannot write {exc.filename or getattr(cfg, key)}: {exc.strerror}"
        return None

    def summary(self) -> list[str]:
        """The startup summary: what this daemon watches, judges with, writes and serves."""
        cfg, rem = self.config, self.remediator
        table = self.pipeline.table
        gpus = []
        for g in self.snapshot.tick.gpus if self.snapshot.tick else ():
            row = table.match(g.name, g.memory_total_bytes)
            gpus.append({"index": g.index, "name": g.name,
                         "memory_total_bytes": g.memory_total_bytes, "row": row.id,
                         "calibrated": row.calibrated, "warning_bytes": row.warning_bytes,
                         "critical_bytes": row.critical_bytes})
        hooks = [h for h in ("snapshot", "flush", "signal", "exec")
                 if getattr(getattr(cfg.remediation, h, None), "enabled", False)]
        configured = {e.name for e in cfg.engines}
        host, port = config_mod.parse_listen(cfg.listen)
        return logfmt.summary_lines({
            "version": __version__,
            "config_source": self.config_path or os.environ.get("GPUWATCH_CONFIG")
            or "defaults (no file)",
            "state_dir": str(state_dir()),
            "audit_path": str(rem.audit_path) if rem else "-",
            "events_log": cfg.events_log, "record": cfg.record,
            "remediation": {"enabled": cfg.remediation.enabled, "hooks": hooks,
                            "dry_run": bool(rem.dry_run if rem else cfg.remediation.dry_run),
                            "webhook": bool(cfg.webhook.token)},
            "gpus": gpus, "gpu_reason": self.sources["nvml"].reason,
            "engines_configured": [f"{e.name} ({e.url})" for e in cfg.engines],
            "engines_discovered": sorted(
                k.split(":", 1)[1] for k in self.sources
                if k.startswith("engine:") and k.split(":", 1)[1] not in configured),
            "discovery": cfg.discovery.enabled,
            "url": logfmt.listen_url(host, port, "https" if self.guard is not None
                                     and self.guard.context is not None else "http"),
            "backend": self.backend.name + (", basic auth" if self.web is not None
                                            and self.web.users else ""),
            "require_gpu": cfg.require_gpu,
        })

    def _close_outputs(self) -> None:
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None
        if self._events_log is not None:
            self._events_log.close()
            self._events_log = None

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT; the exit status. One daemon per state directory."""
        try:
            lock = await asyncio.to_thread(lifecycle.lock_state_dir, state_dir())
        except lifecycle.StateDirBusy as exc:
            log.error("%s", exc)
            return exitcodes.USAGE
        try:
            return await self._run()
        finally:
            if lock is not None:
                os.close(lock)

    def _on_stop_signal(self) -> None:
        if not self._stop.is_set():  # whatever hangs while stopping, the process ends
            lifecycle.exit_after(lifecycle.STOP_DEADLINE_SECONDS, exitcodes.FAILURE)
        self._stop.set()

    async def _run(self) -> int:
        loop = asyncio.get_running_loop()
        host, port = config_mod.parse_listen(self.config.listen)
        try:
            self._make_guard()
        except WebConfigError as exc:
            log.error("%s", exc)
            return exitcodes.USAGE
        try:
            self.remediator = self._make_remediator()
        except (ValueError, OSError) as exc:
            log.error("remediation: %s", exc)
            return exitcodes.USAGE
        problem = self._open_outputs() or otlp_missing(self.config)  # fail before serving
        if problem:
            log.error("%s", problem)
            await self.remediator.close()
            return exitcodes.USAGE
        routes = self.remediator.routes()
        tls = None
        if self.guard is not None:
            self.guard.bearer = frozenset(r.path for r in routes)  # they check their own token
            tls = self.guard.context
        app = make_app(lambda: self.snapshot, self.renderer, extra_routes=routes,
                       guard=self.guard)
        http = self.config.http
        runner = Server(app, Limits.of(http), keepalive_timeout=http.idle_timeout_seconds,
                        refusals=self.guard.take_refusals if self.guard else None)
        try:
            await runner.start(host, port, ssl=tls)
            self.listener = runner.listener
        except OSError as exc:
            log.error("cannot listen on %s: %s", self.config.listen, exc.strerror or exc)
            await runner.close()
            await self.remediator.close()
            self._close_outputs()
            return exitcodes.for_bind_error(exc)
        # "serving on" comes in the startup summary, after the first tick names the GPUs.
        if self.web is not None and self.web.users and tls is None:
            log.warning("basic auth without tls_server_config: passwords cross the network "
                        "in clear")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_stop_signal)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        tasks = []
        try:
            self._start_engines()
            tasks.append(asyncio.create_task(self._tick_loop()))
            self._start_otlp()
            slow = self.config.nvml.slow_interval_seconds
            if slow > 0:
                st = self.sources.setdefault("nvml_slow", SourceStatus())
                tasks.append(asyncio.create_task(self.sampler.slow_loop(slow, st)))
            await self._stop.wait()
            log.info("stopping")
        finally:
            for t in [*tasks, self._engine_task, self._reload_task, self._otlp_task]:
                if t is not None:
                    t.cancel()
            await asyncio.gather(*[t for t in tasks if t], return_exceptions=True)
            await runner.close()
            if self.guard is not None:
                self.guard.close()
            await self.remediator.close()
            self._log_actions(self.remediator.take_done())  # finished while stopping
            self._close_outputs()
            self.sampler.close()
            if self.attribution is not None:
                self.attribution.close()
            if self.nvsentinel is not None:
                self.nvsentinel.close()
        return 0

    def _start_otlp(self) -> None:
        """The pusher of the current [otlp], replacing any earlier one (a reload)."""
        if self._otlp_task is not None:
            self._otlp_task.cancel()
            self._otlp_task = None
        if self.config.otlp.endpoint:
            self._otlp_task = asyncio.create_task(self._otlp())
        else:
            self._extras.pop("otlp", None)

    async def _otlp(self) -> None:
        # imported only here: opentelemetry-proto and protobuf stay out otherwise
        from gpuwatch.otlp.push import OtlpPusher

        cfg = self.config
        pusher = OtlpPusher(cfg.otlp, lambda: self.snapshot, self.host,
                            cfg.attribution.kubernetes_api.node_name)
        for key, value in (self._extras.get("otlp") or {}).items():  # counters only grow
            if key != "queued":
                pusher.counters[key] = value
        self._extras["otlp"] = pusher.counters
        await pusher.run()

    def _make_nvsentinel(self, cfg: Config) -> None:
        """The NVSentinel publisher, new on each (re)configuration: its first pass sends the
        healthy baseline again."""
        if self.nvsentinel is not None:
            self.nvsentinel.close()
            self.nvsentinel = None
        if cfg.nvsentinel.enabled:
            from gpuwatch.nodehealth.nvsentinel import make_publisher

            self.nvsentinel = make_publisher(cfg, self.sources, self.host)

    def _make_guard(self) -> None:
        """TLS, basic auth and headers, when a web configuration file is given; raises
        WebConfigError."""
        if self.web is None and not self.config.web_config:
            return
        # imported only here: a daemon without a web configuration never loads it
        from gpuwatch import webconfig

        if self.web is None:
            self.web = webconfig.load(self.config.web_config)
        self.guard = webconfig.Guard(
            self.web, failures_per_minute=self.config.http.auth_failures_per_minute)

    def _make_remediator(self):
        from gpuwatch.remediation.remediator import Remediator

        cfg = self.config
        return Remediator(cfg.remediation, cfg.webhook, probe_dir=self.probe_dir,
                          table=self.pipeline.table)


def otlp_missing(cfg: Config) -> str:
    """Why an [otlp] endpoint cannot be served here (the extra is not installed), or ""."""
    if not cfg.otlp.endpoint:
        return ""
    try:
        import gpuwatch.otlp.push  # noqa: F401
    except ImportError as exc:
        return (f"otlp.endpoint is set but the OTLP extra is missing ({exc.name}): "
                "pip install 'gpuwatch-agent[otlp]'")
    return ""
