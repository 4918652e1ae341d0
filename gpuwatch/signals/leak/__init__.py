"""Leak detection for one memory series (a process's memory, or a GPU's).

What counts is the memory a series *keeps*, not its peaks (DESIGN.md §3). The pieces, one
idea per module:

- lifecycle.py: loading -> warmup -> steady, recognised by the memory's shape;
- floor.py: the retained memory, on a floor window as long as the series' return period;
- scales.py: its trend over several time scales at once, each judged against the series'
  own noise at that scale, so that a fast leak is found in minutes and a slow one in tens
  of minutes by one mechanism;
- troughs.py: under a sawtooth, its troughs (one per period) rising at a steady pace: a
  leak found in two or three periods, where the scales' floor-window-long parts need more;
- fast.py: the critical fast path on raw samples;
- verdict.py: the episode (levels, hysteresis, one episode per leak);
- series.py: one series, tying them together.
"""

from gpuwatch.signals.leak.fast import FastWindow
from gpuwatch.signals.leak.floor import RetainedFloor
from gpuwatch.signals.leak.lifecycle import LOADING, STEADY, WARMUP, Lifecycle
from gpuwatch.signals.leak.robust import RollingMin, SlidingMax, theil_sen
from gpuwatch.signals.leak.scales import Evidence, Scales
from gpuwatch.signals.leak.series import LeakParams, LeakSeries
from gpuwatch.signals.leak.troughs import Troughs
from gpuwatch.signals.leak.verdict import Verdict

__all__ = ["LOADING", "STEADY", "WARMUP", "Evidence", "FastWindow", "LeakParams",
           "LeakSeries", "Lifecycle", "RetainedFloor", "RollingMin", "Scales", "SlidingMax",
           "Troughs", "Verdict", "theil_sen"]
