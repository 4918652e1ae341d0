"""Metric families for the exposition: the shape prometheus_client's custom-collector families
have (name, documentation, type, samples of (name, labels, value, ...)), so its registry and
generate_latest take them too, without importing prometheus_client in the daemon (whose
import brings an HTTP server, WSGI and e-mail parsing the daemon never uses)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: None = None
    native_histogram: None = None


class Metric:
    def __init__(self, name: str, documentation: str, typ: str, unit: str = "") -> None:
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        self.name = name
        self.documentation = documentation
        self.unit = unit
        self.type = typ
        self.samples: list[Sample] = []

    def add_sample(self, name: str, labels: dict[str, str], value: float,
                   timestamp: float | None = None) -> None:
        self.samples.append(Sample(name, labels, value, timestamp))


class _Family(Metric):
    TYPE = "gauge"
    SUFFIX = ""

    def __init__(self, name: str, documentation: str, value: float | None = None,
                 labels: Sequence[str] | None = None, unit: str = "") -> None:
        if self.SUFFIX and name.endswith(self.SUFFIX):
            name = name[: -len(self.SUFFIX)]
        super().__init__(name, documentation, self.TYPE, unit)
        if labels is not None and value is not None:
            raise ValueError("Can only specify at most one of value and labels.")
        self._labelnames = tuple(labels or ())
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float,
                   timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name + self.SUFFIX,
                                   dict(zip(self._labelnames, labels, strict=False)),
                                   value, timestamp))


class GaugeMetricFamily(_Family):
    TYPE = "gauge"


class CounterMetricFamily(_Family):
    TYPE = "counter"
    SUFFIX = "_total"


class HistogramMetricFamily(Metric):
    """name_bucket{le} per bound, then name_count (the +Inf bucket) and name_sum, as
    prometheus_client writes a custom collector's histogram."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str] | None = None,
                 unit: str = "") -> None:
        super().__init__(name, documentation, "histogram", unit)
        self._labelnames = tuple(labels or ())

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]],
                   sum_value: float | None, timestamp: float | None = None) -> None:
        base = dict(zip(self._labelnames, labels, strict=False))
        for le, count in buckets:
            self.samples.append(Sample(self.name + "_bucket", {**base, "le": le}, count,
                                       timestamp))
        if buckets and float(buckets[0][0]) >= 0 and sum_value is not None:
            self.samples.append(Sample(self.name + "_count", base, buckets[-1][1], timestamp))
            self.samples.append(Sample(self.name + "_sum", base, sum_value, timestamp))


class InfoMetricFamily(Metric):
    """name_info{labels...} 1, as prometheus_client writes an info family."""

    def __init__(self, name: str, documentation: str, value: dict[str, str] | None = None,
                 labels: Sequence[str] | None = None) -> None:
        super().__init__(name, documentation, "info")
        self._labelnames = tuple(labels or ())
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: dict[str, str],
                   timestamp: float | None = None) -> None:
        self.samples.append(Sample(self.name + "_info",
                                   dict(dict(zip(self._labelnames, labels, strict=False)),
                                        **value), 1.0, timestamp))


def float_to_go_string(d: float) -> str:
    """A value as Go's strconv writes it (what Prometheus and prometheus_client write)."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s
