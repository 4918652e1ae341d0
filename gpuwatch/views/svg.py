"""Small inline SVG time-series charts for the report: lines with a min/max envelope,
horizontal bands (threshold zones), markers (events, actions) and vertical rules.
Everything a caller passes is escaped; the output has no script and no external reference."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from html import escape

W, H = 1080, 220
LEFT, RIGHT, TOP, BOTTOM = 70, 12, 12, 26
_TIME_STEPS = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
               172800, 604800)


class Envelope:
    """A series decimated into at most 2 x max_points buckets of min / max / last: bucket
    width doubles when full, so memory stays bounded over any recording length and the
    peaks survive the decimation."""

    def __init__(self, t0: float, max_points: int = 500, width: float = 1.0) -> None:
        self.t0 = t0
        self.max_points = max_points
        self.width = width
        self.buckets: list[list[float]] = []  # [k, min, max, last, t_last]

    def add(self, t: float, v: float) -> None:
        k = math.floor((t - self.t0) / self.width)
        b = self.buckets
        if b and b[-1][0] == k:
            last = b[-1]
            last[1], last[2], last[3], last[4] = min(last[1], v), max(last[2], v), v, t
            return
        b.append([k, v, v, v, t])
        if len(b) > 2 * self.max_points:
            self._halve()

    def _halve(self) -> None:
        self.width *= 2
        merged: list[list[float]] = []
        for k, lo, hi, last, tl in self.buckets:
            k2 = k // 2
            if merged and merged[-1][0] == k2:
                m = merged[-1]
                m[1], m[2], m[3], m[4] = min(m[1], lo), max(m[2], hi), last, tl
            else:
                merged.append([k2, lo, hi, last, tl])
        self.buckets = merged

    def __len__(self) -> int:
        return len(self.buckets)

    def runs(self, breaks: float | None = None) -> list[list[tuple[float, float, float, float]]]:
        """(t, min, max, last) points, split where the series has a gap: more than two
        buckets, or with `breaks`, more than that many seconds (late ticks are not a gap)."""
        out: list[list[tuple[float, float, float, float]]] = []
        prev = None
        for k, lo, hi, last, _ in self.buckets:
            if prev is None or (k - prev > 2 if breaks is None
                                else (k - prev) * self.width > max(breaks, 2 * self.width)):
                out.append([])
            out[-1].append((self.t0 + (k + 0.5) * self.width, lo, hi, last))
            prev = k
        return out

    def min_between(self, t0: float, t1: float) -> float | None:
        vals = [lo for k, lo, _, _, _ in self.buckets
                if t0 <= self.t0 + (k + 1) * self.width and self.t0 + k * self.width <= t1]
        return min(vals) if vals else None

    def bounds(self) -> tuple[float, float] | None:
        if not self.buckets:
            return None
        return min(b[1] for b in self.buckets), max(b[2] for b in self.buckets)


@dataclass
class Line:
    label: str
    color: str
    env: Envelope | None = None
    points: list[tuple[float, float]] = field(default_factory=list)  # exact (t, v)
    dash: str = ""
    width: float = 1.6
    band: bool = True  # draw the min/max envelope


@dataclass
class Marker:
    t: float
    y: float | None  # None: on the top edge
    color: str
    title: str
    shape: str = "tri"  # tri | circle | diamond


def nice_step(span: float, target: int = 5) -> float:
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def chart(lines: list[Line], t0: float, t1: float, fmt_y, *, bands=(), markers=(),
          vrules=(), y_range: tuple[float, float] | None = None, height: int = H,
          title: str = "", y_unit: float = 1.0, gaps=(), breaks: float | None = None) -> str:
    """bands: (y0, y1, css class, label); vrules: (t, css class, label); y ticks fall on
    round multiples of y_unit (GiB for memory); gaps: (t0, t1) spans without a sample, shaded;
    breaks: lines break only across gaps longer than this (seconds)."""
    if t1 <= t0:
        t1 = t0 + 1
    lo = hi = None
    for ln in lines:
        for b in ([ln.env.bounds()] if ln.env else []) + [
                (min(v for _, v in ln.points), max(v for _, v in ln.points))
                if ln.points else None]:
            if b is None:
                continue
            lo = b[0] if lo is None else min(lo, b[0])
            hi = b[1] if hi is None else max(hi, b[1])
    if y_range is not None:
        lo, hi = y_range
    if lo is None or hi is None:
        lo, hi = 0.0, 1.0
    if hi <= lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    pad = (hi - lo) * 0.06
    if y_range is None:
        lo, hi = lo - pad, hi + pad
    pw, ph = W - LEFT - RIGHT, height - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return TOP + (1 - (v - lo) / (hi - lo)) * ph

    def clip(v: float) -> float:
        return min(max(v, lo), hi)

    out = [f'<svg class="chart" viewBox="0 0 {W} {height}" role="img" '
           f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    for y0, y1, cls, label in bands:
        a, b = clip(y0), clip(y1)
        if b > a:
            out.append(f'<rect class="band {cls}" x="{LEFT}" y="{y(b):.1f}" width="{pw}" '
                       f'height="{y(a) - y(b):.1f}"><title>{escape(label)}</title></rect>')
    for g0, g1 in gaps:
        a, b = max(g0, t0), min(g1, t1)
        if b > a:
            out.append(f'<rect class="gap" x="{x(a):.1f}" y="{TOP}" width="{x(b) - x(a):.1f}" '
                       f'height="{ph}"><title>no sample for {b - a:.0f} s (ticks late)'
                       f"</title></rect>")
    step = nice_step((hi - lo) / y_unit) * y_unit
    v = math.ceil(lo / step) * step
    while v <= hi + 1e-9 * step:
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" '
                   f'y2="{y(v):.1f}"/><text class="ylab" x="{LEFT - 6}" y="{y(v) + 4:.1f}">'
                   f'{escape(fmt_y(v))}</text>')
        v += step
    tstep = next((s for s in _TIME_STEPS if (t1 - t0) / s <= 9), _TIME_STEPS[-1])
    tt = math.ceil(t0 / tstep) * tstep
    tfmt = "%H:%M:%S" if tstep < 60 else "%H:%M" if tstep < 86400 else "%m-%d"
    while tt <= t1:
        out.append(f'<line class="grid" x1="{x(tt):.1f}" x2="{x(tt):.1f}" y1="{TOP}" '
                   f'y2="{TOP + ph}"/><text class="xlab" x="{x(tt):.1f}" y="{height - 8}">'
                   f'{time.strftime(tfmt, time.gmtime(tt))}</text>')
        tt += tstep
    for i, (t, cls, label) in enumerate(vrules):
        # labels alternate sides and rows, so two close rules stay readable
        side = ("end", -3) if i % 2 == 0 and x(t) - LEFT > 160 else ("start", 3)
        out.append(f'<line class="vrule {cls}" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" '
                   f'y2="{TOP + ph}"><title>{escape(label)}</title></line>'
                   f'<text class="vlab {cls}" text-anchor="{side[0]}" x="{x(t) + side[1]:.1f}" '
                   f'y="{TOP + 12 + 13 * (i % 2)}">{escape(label)}</text>')
    for ln in lines:
        style = f'stroke="{ln.color}" stroke-width="{ln.width}"' + (
            f' stroke-dasharray="{ln.dash}"' if ln.dash else "")
        if ln.env is not None:
            for run in ln.env.runs(breaks):
                if ln.band and len(run) > 1:
                    poly = [f"{x(t):.1f},{y(clip(hi_)):.1f}" for t, _, hi_, _ in run] + [
                        f"{x(t):.1f},{y(clip(lo_)):.1f}" for t, lo_, _, _ in reversed(run)]
                    out.append(f'<polygon class="env" fill="{ln.color}" '
                               f'points="{" ".join(poly)}"/>')
                pts = " ".join(f"{x(t):.1f},{y(clip(last)):.1f}" for t, _, _, last in run)
                out.append(f'<polyline class="ln" fill="none" {style} points="{pts}">'
                           f'<title>{escape(ln.label)}</title></polyline>')
        if ln.points:
            pts = " ".join(f"{x(t):.1f},{y(clip(v)):.1f}" for t, v in ln.points)
            out.append(f'<polyline class="ln" fill="none" {style} points="{pts}">'
                       f'<title>{escape(ln.label)}</title></polyline>')
    for m in markers:
        if not t0 <= m.t <= t1:
            continue
        cx, cy = x(m.t), (y(clip(m.y)) if m.y is not None else TOP + 6)
        if m.shape == "circle":
            shape = (f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="none" '
                     f'stroke="{m.color}" stroke-width="2"/>')
        elif m.shape == "diamond":
            shape = (f'<path d="M{cx:.1f} {cy - 6:.1f}l6 6l-6 6l-6 -6z" fill="{m.color}" '
                     f'stroke="var(--card)"/>')
        else:
            shape = (f'<path d="M{cx:.1f} {cy + 6:.1f}l-6 -10h12z" fill="{m.color}" '
                     f'stroke="var(--card)"/>')
        out.append(f'<g class="marker">{shape}<title>{escape(m.title)}</title></g>')
    out.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}"/></svg>')
    legend = "".join(
        f'<span><i style="background:{ln.color}"></i>{escape(ln.label)}</span>' for ln in lines)
    return f'<figure class="plot">{"".join(out)}<figcaption>{legend}</figcaption></figure>'
