"""What a remote party may cost before it has proven who it is: a per-client budget of failed
logins, and a bounded queue in front of bcrypt in which clients without failures go first.

Clients are keyed by address: an IPv4 address, or the /64 of an IPv6 one (a single host
usually holds a whole /64, and would otherwise get a fresh budget per address).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

MAX_CLIENTS = 4096


def client_key(address: str | None) -> str:
    """The key a client's budgets are kept under ('' when the address is unknown)."""
    if not address:
        return ""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class FailureBudget:
    """Failed logins per client, as a token bucket: `burst` at once, then `per_minute`. A
    client past its budget is refused before its credentials are checked; one with no
    failure on record is `clean`."""

    def __init__(self, per_minute: float = 10.0, burst: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.burst = burst
        self.clock = clock
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # key -> [tokens, t]

    def _tokens(self, key: str) -> float:
        entry = self._buckets.get(key)
        if entry is None:
            return self.burst
        tokens = min(self.burst, entry[0] + (self.clock() - entry[1]) * self.rate)
        if tokens >= self.burst:  # paid back in full: forgotten
            del self._buckets[key]
        return tokens

    def retry_after(self, key: str) -> float:
        """0 when the client may try; else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        tokens = self._tokens(key)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def clean(self, key: str) -> bool:
        return self._tokens(key) >= self.burst

    def failed(self, key: str) -> None:
        tokens = self._tokens(key)
        self._buckets[key] = [tokens - 1, self.clock()]
        self._buckets.move_to_end(key)
        while len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)


class Busy(Exception):
    """The queue is full: answer at once (503), do not wait."""


class BoundedWorkers:
    """Runs a blocking function on its own `workers` threads (never the event loop, never
    the default executor that probe reads and reloads use), with at most `max_waiting`
    callers waiting for a thread. A clean caller that finds the queue full takes the place
    of the newest waiting one that is not clean; otherwise the newcomer is Busy."""

    def __init__(self, workers: int, max_waiting: int, name: str) -> None:
        self.workers = workers
        self.max_waiting = max_waiting
        self.name = name
        self._running = 0
        # (client, future) of each caller waiting for a thread, in order.
        self._clean: deque[tuple[str, asyncio.Future]] = deque()
        self._suspect: deque[tuple[str, asyncio.Future]] = deque()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def waiting(self) -> int:
        return len(self._clean) + len(self._suspect)

    async def run(self, fn: Callable[..., Any], *args: Any, clean: bool = True,
                  client: str = "") -> Any:
        if self._running >= self.workers or self.waiting:
            await self._wait_turn(clean, client)
        else:
            self._running += 1
        try:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    self.workers, thread_name_prefix=self.name)
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        finally:
            self._release()

    def demote(self, client: str) -> None:
        """The client has just failed: its callers still waiting go behind the clean ones."""
        stay = deque()
        for item in self._clean:
            (self._suspect if item[0] == client else stay).append(item)
        self._clean = stay

    async def _wait_turn(self, clean: bool, client: str) -> None:
        if self.waiting >= self.max_waiting and not (clean and self._bump()):
            raise Busy
        fut = asyncio.get_running_loop().create_future()
        item = (client, fut)
        (self._clean if clean else self._suspect).append(item)
        try:
            await fut  # _release hands its thread over: _running already counts this one
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release()  # handed over just as the caller went away
            for queue in (self._clean, self._suspect):
                if item in queue:
                    queue.remove(item)
            raise

    def _bump(self) -> bool:
        """Turn away the newest waiting caller that is not clean; False when there is none."""
        while self._suspect:
            _, fut = self._suspect.pop()
            if not fut.done():
                fut.set_exception(Busy())
                return True
        return False

    def _release(self) -> None:
        for queue in (self._clean, self._suspect):
            while queue:
                _, fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)
                    return
        self._running -= 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
