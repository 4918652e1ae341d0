"""The report's stylesheet (light and dark) and its how-to-read paragraph."""

CSS = """
:root { --bg:#f6f7f9; --card:#fff; --fg:#1d2430; --muted:#5f6b7a; --line:#dde1e7;
  --safe:#2f9e44; --warn:#e8a200; --crit:#e03131; --accent:#3b6fd4; }
@media (prefers-color-scheme: dark) { :root { --bg:#0f1216; --card:#171b21; --fg:#e3e7ec;
  --muted:#8e99a6; --line:#2a3039; --safe:#40c057; --warn:#f2b01e; --crit:#ff5c5c;
  --accent:#6d9cff; } }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif; }
main { max-width:1140px; margin:0 auto; padding:18px 20px 40px; }
h1 { font-size:22px; margin:0 0 4px; } h2 { font-size:17px; margin:28px 0 8px; }
h3 { font-size:15px; margin:18px 0 4px; }
.meta, .muted, figcaption { color:var(--muted); }
.card { background:var(--card); border:1px solid var(--line); border-radius:8px;
  padding:12px 14px; margin:8px 0; }
table { width:100%; border-collapse:collapse; font-size:13px; font-variant-numeric:tabular-nums; }
th { text-align:left; color:var(--muted); font-weight:600; font-size:12px;
  border-bottom:1px solid var(--line); padding:4px 6px; }
td { padding:4px 6px; border-bottom:1px solid var(--line); vertical-align:top; }
td.n, th.n { text-align:right; white-space:nowrap; }
.badge { display:inline-block; padding:0 7px; border-radius:9px; font-size:12px; font-weight:600;
  color:#fff; background:var(--warn); }
.badge.critical { background:var(--crit); } .badge.warning { color:#1d1d1d; }
.badge.resolved { background:var(--safe); } .badge.ongoing { background:var(--muted); }
figure.plot { margin:6px 0 14px; }
svg.chart { width:100%; height:auto; display:block; }
svg .grid { stroke:var(--line); stroke-width:1; }
svg .frame { fill:none; stroke:var(--line); }
svg text { fill:var(--muted); font-size:11px; font-family:inherit; }
svg .ylab { text-anchor:end; } svg .xlab { text-anchor:middle; }
svg .band.safe { fill:var(--safe); opacity:.08; }
svg .band.warning { fill:var(--warn); opacity:.16; }
svg .band.critical { fill:var(--crit); opacity:.16; }
svg .env { opacity:.18; stroke:none; }
svg .gap { fill:var(--muted); opacity:.12; }
.card.late { border-left:4px solid var(--warn); }
svg .vrule { stroke-width:1.5; stroke-dasharray:4 3; }
svg .vrule.onset { stroke:#ae3ec9; } svg .vrule.detect { stroke:var(--crit); }
svg .vlab.onset { fill:#ae3ec9; } svg .vlab.detect { fill:var(--crit); }
figcaption span { margin-right:14px; font-size:12px; }
figcaption i { display:inline-block; width:12px; height:3px; margin-right:5px;
  vertical-align:middle; }
.explain { font-size:13px; color:var(--muted); }
"""


EXPLAIN = """<p class="explain">How to read this: each GPU chart shows its memory over time
against the threshold table's zones (green safe, amber warning, red critical; MiB = 2<sup>20</sup>
bytes). For a GPU running an inference engine that pre-allocates its KV cache, the zones judge
the memory outside that planned pool. Each process chart shows its memory (the shaded band is
the min&ndash;max within each plotted interval), the <b style="color:#e8590c">retained floor</b> the
leak detector tracks (memory the process keeps; allocator sawtooth and bursts do not lift it),
and, once a leak is detected, the <b style="color:#ae3ec9">fitted trend</b> with its estimated
onset and the detection time. Triangles are events firing (amber warning, red critical),
circles resolved, diamonds actions. "Planned" actions are what the remediation policy plans
for each event when replayed (on the live host guardrails decide whether they run); "taken"
ones come from the daemon's audit log (<code>--audit</code>).</p>"""
