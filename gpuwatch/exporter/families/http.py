"""The daemon's own HTTP side: open connections, what was closed or refused and why.

Present once the daemon serves (extras["http"]); every reason is exported from the start, at
zero, so an alert on increase() sees the first refusal.
"""

from __future__ import annotations

from gpuwatch.exporter.metric import CounterMetricFamily, GaugeMetricFamily

CLOSE_REASONS = ("header_timeout", "write_timeout", "over_capacity", "client_limit",
                 "made_room")
LOGIN_REASONS = ("unauthorized", "rate_limited", "busy")


def collect(snap):
    http = (getattr(snap, "extras", None) or {}).get("http")
    if not http:
        return
    yield GaugeMetricFamily("gpuwatch_http_connections", "Client connections open now.",
                            value=http.get("open", 0))
    yield GaugeMetricFamily(
        "gpuwatch_http_connections_max",
        "Client connections allowed at once ([http] max_connections, lowered to fit the "
        "descriptor limit).", value=http.get("cap", 0))
    closed = CounterMetricFamily(
        "gpuwatch_http_connections_closed",
        "Connections closed or refused by the daemon, by reason: header_timeout (no complete "
        "request headers in time, TLS handshake included), write_timeout (the client did not "
        "read its response), over_capacity, client_limit (per client address), made_room "
        "(the quietest connection, closed for a new one at the cap).", labels=["reason"])
    counts = http.get("closed") or {}
    for reason in CLOSE_REASONS:
        closed.add_metric([reason], float(counts.get(reason, 0)))
    yield closed
    yield CounterMetricFamily(
        "gpuwatch_http_accept_errors",
        "accept() failures (mostly: out of file descriptors).",
        value=float(http.get("accept_errors", 0)))
    logins = http.get("logins_refused")
    if logins is not None:
        fam = CounterMetricFamily(
            "gpuwatch_http_logins_refused",
            "Requests refused by basic auth, by reason: unauthorized (401), rate_limited "
            "(429, too many failed logins from the address), busy (503, bcrypt's queue full).",
            labels=["reason"])
        for reason in LOGIN_REASONS:
            fam.add_metric([reason], float(logins.get(reason, 0)))
        yield fam
