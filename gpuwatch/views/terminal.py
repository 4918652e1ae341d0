"""`gpuwatch status [URL] [--watch N]`: a one-screen summary of a running daemon, read from
its /api/state. Colour (rich, when installed) on a terminal; plain text in a pipe.

The state is first reduced to plain rows (`summarize`), which both renderers draw: what is
shown does not depend on whether colour is available."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from gpuwatch.safetext import printable_tree
from gpuwatch.views import fmt
from gpuwatch.views import serving as serving_view

MAX_BODY = 64 << 20  # a state document far beyond any real host's is refused, not buffered
TOP_PROCESSES = 3
BAR = 32
ZONES = ("safe", "warning", "critical")


class StatusError(Exception):
    pass


def fetch_state(url: str, timeout: float = 5.0, auth: tuple[str, str] | None = None,
                cafile: str | None = None) -> dict:
    """/api/state of a daemon, with basic auth and a CA for its TLS certificate when its web
    configuration asks for them."""
    api = url.rstrip("/") + "/api/state"
    req = urllib.request.Request(api)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=cafile) if api.startswith("https:") else None
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            body = r.read(MAX_BODY + 1)
    except urllib.error.HTTPError as exc:
        raise StatusError(f"{api}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusError(f"{api}: cannot connect: {reason}") from None
    if len(body) > MAX_BODY:
        raise StatusError(f"{api}: answer larger than {MAX_BODY >> 20} MiB")
    try:
        state = json.loads(body)
    except ValueError as exc:
        raise StatusError(f"{api}: not a gpuwatch state document: {exc}") from None
    if not isinstance(state, dict):
        raise StatusError(f"{api}: not a gpuwatch state document")
    return state


def check_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.username is not None or parts.password is not None:
        # a password in a URL ends up in shell history and the process list
        raise ValueError("URL: credentials in the URL are not accepted; use --user and "
                         "--password-file")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"URL {url!r}: expected http://HOST:PORT or https://HOST:PORT")
    return url


# -- the summary, as plain rows ------------------------------------------------------------

@dataclass
class GpuRow:
    index: str
    name: str
    zone: int | None
    used: float | None
    total: float | None
    judged: float | None
    warning: float | None
    critical: float | None
    util: str
    temp: str
    power: str
    leak: str
    health: list[str]
    # pid, name, mem, rate, ttoom, host CPU and RSS
    processes: list[list[str]] = field(default_factory=list)
    more: int = 0
    leaking: set[str] = field(default_factory=set)


@dataclass
class Summary:
    header: str
    problems: list[str]
    gpus: list[GpuRow]
    engines: list[list[str]]
    events: list[tuple[str, str]]  # severity, text
    actions: list[tuple[str, str]]  # result, text
    serving: dict[str, list[str]] = field(default_factory=dict)  # engine -> SLI lines


def _d(v) -> dict:
    return v if isinstance(v, dict) else {}


def _l(v) -> list:
    return v if isinstance(v, list) else []


def _num(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def summarize(state: dict, url: str) -> Summary:
    state = printable_tree(state)  # names, reasons, messages: nothing drives the terminal
    signals = _d(state.get("signals"))
    table = _d(signals.get("threshold_table"))
    gpus = [g for g in _l(_d(state.get("sample")).get("gpus")) if isinstance(g, dict)]
    labels = {g.get("uuid"): f"GPU {g.get('index', '?')}" for g in gpus}
    names = {p.get("pid"): p.get("name", "") for g in gpus for p in _l(g.get("processes"))
             if isinstance(p, dict)}
    procsig = {(p.get("uuid"), p.get("pid")): p for p in _l(signals.get("processes"))
               if isinstance(p, dict)}
    header = " · ".join([f"gpuwatch {state.get('version', fmt.DASH)}", url,
                         f"sample {fmt.clock(state.get('t'))}",
                         f"thresholds {table.get('version', fmt.DASH)}"])
    problems = [f"source {name} down: {src.get('reason')}"
                for name, src in _d(state.get("sources")).items()
                if isinstance(src, dict) and src.get("up") is False
                and (src.get("reason") or src.get("errors_total"))]
    if state.get("ready") is False:
        problems.append("waiting for the first complete sample")
    rows = [_gpu_row(g, _d(_d(signals.get("gpus")).get(g.get("uuid"))), procsig) for g in gpus]
    engines = []
    serving: dict[str, list[str]] = {}
    for e in _d(signals.get("engines")).values():
        if not isinstance(e, dict):
            continue
        q = _d(e.get("queue_latency_seconds")).get("0.95")
        up = "up" if e.get("up") is True else f"down: {e.get('reason') or '?'}" \
            if e.get("up") is False else fmt.DASH
        engines.append([str(e.get("name", "?")), str(e.get("kind") or fmt.DASH), up,
                        f"run {_int(e.get('requests_running'))} wait "
                        f"{_int(e.get('requests_waiting'))}",
                        f"KV {fmt.percent(e.get('kv_cache_usage_ratio'))}",
                        f"hit {fmt.percent(e.get('kv_cache_hit_ratio'))}",
                        f"queue p95 {fmt.signal_value('queue_latency', q)}",
                        f"preempt {_int(e.get('preemptions_total'))}"])
        serving[str(e.get("name", "?"))] = serving_view.lines(e)
    events = []
    for ev in _l(state.get("active_events")):
        if not isinstance(ev, dict):
            continue
        where = fmt.place(ev.get("gpu_uuid"), ev.get("pid"), ev.get("engine"), labels, names)
        events.append((ev.get("severity") or "warning",
                       f"{ev.get('signal', '?')} · {where} · since {fmt.clock(ev.get('t'))}: "
                       f"{ev.get('message', '')}"))
    actions = []
    for a in [a for a in _l(state.get("recent_events")) if isinstance(a, dict)
              and a.get("action")][-5:]:
        d = _d(a.get("detail"))
        target = fmt.place(d.get("gpu_uuid"), d.get("pid"), d.get("engine"), labels, names)
        actions.append((str(a.get("result", "?")),
                        f"{fmt.clock(a.get('t'))} {a.get('action')} "
                        f"{target if target != fmt.DASH else a.get('target', '')} → "
                        f"{a.get('result', '?')}"))
    return Summary(header, problems, rows, engines, events, actions, serving)


def _who(p: dict) -> str:
    """The process name, and its pod where attribution knows it."""
    pod = "/".join(str(x) for x in (p.get("namespace"), p.get("pod")) if x)
    return str(p.get("name") or fmt.DASH) + (f" ({pod})" if p.get("pod") else "")


def _host(p: dict) -> str:
    """The process's host side, as nvitop shows it: CPU (share of a core) and RSS."""
    parts = [f"CPU {100 * p['cpu_ratio']:.0f} %" if _num(p.get("cpu_ratio")) else "",
             f"RSS {fmt.size(p['resident_memory_bytes'])}"
             if _num(p.get("resident_memory_bytes")) else ""]
    return " ".join(x for x in parts if x)


def _int(v) -> str:
    return f"{v:.0f}" if _num(v) else fmt.DASH


def _gpu_row(g: dict, s: dict, procsig: dict) -> GpuRow:
    th = _d(s.get("thresholds"))
    health = []
    if g.get("lost"):
        health.append("GPU LOST")
    xids = _d(g.get("xid_events_total"))
    if xids:
        health.append("XID " + ",".join(f"{k}x{v}" for k, v in xids.items()))
    if _num(g.get("ecc_volatile_uncorrected_total")) and g["ecc_volatile_uncorrected_total"]:
        health.append(f"ECC uncorrected {g['ecc_volatile_uncorrected_total']}")
    if g.get("remapped_rows_failure") or g.get("remapped_rows_pending"):
        health.append("row remap " + ("failure" if g.get("remapped_rows_failure") else "pending"))
    power = f"{g['power_watts']:.0f} W" if _num(g.get("power_watts")) else fmt.DASH
    temp = f"{g['temperature_celsius']:.0f} °C" if _num(g.get("temperature_celsius")) \
        else fmt.DASH
    leak = ""
    if _num(s.get("leak_rate_bytes_per_second")):
        leak = f"GPU leak {fmt.rate(s['leak_rate_bytes_per_second'])}"
        if _num(s.get("headroom_bytes")) and s["headroom_bytes"] < 0:
            leak += f", {fmt.time_to_oom(None, s['headroom_bytes'])}"
        elif _num(s.get("time_to_oom_seconds")):
            leak += f", OOM in {fmt.time_to_oom(s['time_to_oom_seconds'])}"
    row = GpuRow(str(g.get("index", "?")), str(g.get("name") or fmt.DASH),
                 s.get("zone") if _num(s.get("zone")) else None,
                 g.get("memory_used_bytes"), g.get("memory_total_bytes"),
                 s.get("unplanned_memory_bytes", g.get("memory_used_bytes")),
                 th.get("warning"), th.get("critical"),
                 fmt.percent(g.get("utilization_ratio")), temp, power, leak, health)
    procs = []
    for p in _l(g.get("processes")):
        if not isinstance(p, dict):
            continue
        ps = _d(procsig.get((g.get("uuid"), p.get("pid"))))
        rate, ttoom = ps.get("leak_rate_bytes_per_second"), ps.get("time_to_oom_seconds")
        procs.append((_num(ttoom), p.get("used_memory_bytes") or 0, [
            str(p.get("pid", "?")), _who(p),
            fmt.size(p.get("used_memory_bytes")),
            f"leak {fmt.rate(rate)}" if _num(rate) else "",
            (("OOM in " if ttoom else "") + fmt.time_to_oom(ttoom)) if _num(ttoom) else "",
            _host(p)]))
    procs.sort(key=lambda x: (not x[0], -x[1]))
    shown = [p for p in procs if p[0]] + [p for p in procs if not p[0]][:TOP_PROCESSES]
    row.processes = [cells for _, _, cells in shown[:max(TOP_PROCESSES, len(shown))]]
    row.leaking = {cells[0] for leaking, _, cells in procs if leaking}
    row.more = len(procs) - len(row.processes)
    return row


def bar(row: GpuRow, width: int = BAR) -> list[tuple[str, str]]:
    """The memory bar as (chars, kind) runs: judged memory, planned pool, free; the
    warning and critical positions replace the cell they fall on with W and C."""
    total = row.total if _num(row.total) and row.total > 0 else None
    if total is None or not _num(row.used):
        return [("?" * width, "free")]
    judged = row.judged if _num(row.judged) else row.used

    def cell(v: float) -> int:
        return max(0, min(width, round(width * v / total)))

    nj, np_ = cell(judged), cell(row.used) - cell(judged)
    cells = ["#"] * nj + ["="] * max(0, np_)
    cells += ["."] * (width - len(cells))
    kinds = ["judged"] * nj + ["planned"] * max(0, np_) + ["free"] * (width - nj - max(0, np_))
    for v, mark in ((row.warning, "W"), (row.critical, "C")):
        if _num(v):
            i = min(width - 1, cell(v))
            cells[i], kinds[i] = mark, mark
    runs: list[tuple[str, str]] = []
    for c, k in zip(cells, kinds, strict=True):
        if runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0] + c, k)
        else:
            runs.append((c, k))
    return runs


def _mem(row: GpuRow) -> str:
    used = f"{row.used / fmt.GIB:.1f}" if _num(row.used) else fmt.DASH
    total = f"{row.total / fmt.GIB:.1f} GiB" if _num(row.total) else fmt.DASH
    return f"{used}/{total}"


def _zone(row: GpuRow) -> str:
    return ZONES[row.zone] if row.zone in (0, 1, 2) else fmt.DASH


# -- renderers -----------------------------------------------------------------------------

def render_plain(s: Summary) -> str:
    out = [s.header]
    out += [f"! {p}" for p in s.problems]
    out.append("")
    for r in s.gpus:
        b = "".join(chars for chars, _ in bar(r))
        out.append(f"GPU {r.index:<2} {r.name[:26]:<26} [{b}] {_mem(r):>15} {_zone(r):<8} "
                   f"util {r.util:>5}  {r.temp:>6}  {r.power:>6}")
        extra = [x for x in (r.leak, " · ".join(r.health)) if x]
        if extra:
            out.append("       " + " · ".join(extra))
        for cells in r.processes:
            out.append(f"       pid {cells[0]:>7} {cells[1][:40]:<22} {cells[2]:>10}  "
                       f"{cells[5]:<20} {cells[3]:<20} {cells[4]}".rstrip())
        if r.more:
            out.append(f"       … {r.more} more processes")
    out.append("")
    out.append("ENGINES" if s.engines else "ENGINES  none")
    for e in s.engines:
        out.append("  " + "  ".join(e))
        out += ["      " + text for text in s.serving.get(e[0], [])]
    out.append("")
    out.append("ACTIVE EVENTS" if s.events else "ACTIVE EVENTS  none")
    out += [f"  {sev:<8} {text}" for sev, text in s.events]
    out.append("")
    out.append("ACTIONS" if s.actions else "ACTIONS  none")
    out += [f"  {text}" for _, text in s.actions]
    return "\n".join(out) + "\n"


def redraw(text: str, first: bool) -> str:
    """A frame that replaces the previous one in place: the cursor home, each line cleared
    to its end, the rest of the screen cleared (the first frame clears it all)."""
    body = "\x1b[K\n".join(text.rstrip("\n").split("\n"))
    return ("\x1b[2J" if first else "") + "\x1b[H" + body + "\x1b[K\n\x1b[J"


def render_rich(s: Summary, console) -> None:
    from rich.table import Table
    from rich.text import Text

    zone_style = {0: "green", 1: "yellow", 2: "bold red"}
    sev_style = {"warning": "yellow", "critical": "bold red"}
    console.print(Text(s.header, style="bold"))
    for p in s.problems:
        console.print(Text(f"! {p}", style="bold red"))
    t = Table(box=None, padding=(0, 1), show_header=True, header_style="dim", expand=False)
    for col in ("GPU", "model / process", "memory", "used", "zone", "util", "temp", "power"):
        t.add_column(col)
    for r in s.gpus:
        style = zone_style.get(r.zone, "white")
        b = Text()
        for chars, kind in bar(r):
            b.append(chars, style={"judged": style, "planned": "blue", "free": "dim",
                                   "W": "bold yellow", "C": "bold red"}[kind])
        t.add_row(r.index, r.name, b, _mem(r), Text(_zone(r), style=style), r.util, r.temp,
                  r.power)
        extra = [x for x in (r.leak, " · ".join(r.health)) if x]
        if extra:
            t.add_row("", Text(" · ".join(extra), style="bold red"))
        for cells in r.processes:
            leaking = cells[0] in r.leaking
            t.add_row("", Text(f"pid {cells[0]} {cells[1]}",
                               style="bold red" if leaking else ""),
                      Text(f"{cells[3]} {cells[4]}".strip(), style="bold red"),
                      f"{cells[2]} {cells[5]}".strip())
        if r.more:
            t.add_row("", Text(f"… {r.more} more processes", style="dim"))
    console.print(t)
    if s.engines:
        et = Table(box=None, padding=(0, 1), title="engines", title_justify="left",
                   show_header=False)
        for e in s.engines:
            et.add_row(*[Text(c, style="red" if c.startswith("down") else "") for c in e])
            for text in s.serving.get(e[0], []):
                et.add_row("", Text(text, style="dim"))
        console.print(et)
    else:
        console.print(Text("engines: none", style="dim"))
    console.print(Text("active events" if s.events else "active events: none",
                       style="bold" if s.events else "dim"))
    for sev, text in s.events:
        console.print(Text(f"  {sev:<8} ", style=sev_style.get(sev, "")) + Text(text))
    console.print(Text("actions" if s.actions else "actions: none",
                       style="bold" if s.actions else "dim"))
    for result, text in s.actions:
        console.print(Text(f"  {text}", style="green" if result == "ok" else "yellow"))
