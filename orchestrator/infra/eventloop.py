"""Which event loop the `mars` processes run on.

Every MARS process spends most of its time in the event loop and in socket writes (each NATS
message is a callback and a `send`), so it runs on uvloop where it is installed (a core
dependency on Linux and macOS): on the 2-core reference machine a request/reply round trip
between two processes drops from ~0.63 to ~0.37 ms. `MARS_LOOP=asyncio` keeps the standard
loop, e.g. to rule uvloop out when chasing a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop, or None (the standard one) when opted out or not installed."""
    if os.environ.get("MARS_LOOP", "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name() -> str:
    return "asyncio" if loop_factory() is None else "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on the loop `loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


#: Garbage collections at least this long are logged by `gc_pause_hook` (debug).
GC_PAUSE_LOGGED_S = 0.002
#: `PacedGc`: a full collection at least this often once the service is up...
GC_EVERY_S = 300.0
#: ...or sooner, once this many more tracked objects were made than freed since the last one
#: (a bound on what cyclic garbage can pile up between two).
GC_MOST_YOUNG = 1_000_000
#: A due collection waits for a moment the service calls idle at most this long.
GC_IDLE_WAIT_S = 30.0
#: How often `PacedGc.run` looks whether a collection is due.
GC_TICK_S = 0.25


class PacedGc:
    """A long-running service's cyclic garbage collector, run when the service is idle rather
    than when a count of allocations says so.

    The orchestrator's garbage goes by reference counting: in the placement benchmark its
    automatic young collections freed nothing (collected=0) and stopped the event loop 12-86
    ms each, 3-4 times a run, holding every placement under way; one full collection over a
    whole run of 3,500 pipelines found 7 objects. So once the service is up what start-up
    made is frozen (never scanned), the automatic collector is off, and a full collection
    runs every `every_s`, or after `most_young` net allocations, at the first moment `idle`
    says yes within `idle_wait_s` of being due (else anyway)."""

    def __init__(
        self,
        idle: Callable[[], bool] = lambda: True,
        *,
        every_s: float = GC_EVERY_S,
        most_young: int = GC_MOST_YOUNG,
        idle_wait_s: float = GC_IDLE_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle = idle
        self.every_s = every_s
        self.most_young = most_young
        self.idle_wait_s = idle_wait_s
        self.clock = clock
        #: Collections run (a gauge for tests and logs).
        self.collections = 0
        self._last = clock()
        self._due_since: float | None = None
        self._on = False

    def start(self) -> None:
        """Freeze what exists and turn the automatic collector off."""
        gc.freeze()
        gc.disable()
        self._last, self._on = self.clock(), True

    def stop(self) -> None:
        """The automatic collector back on."""
        gc.enable()
        self._on = False

    def step(self) -> bool:
        """Collect if a collection is due and the moment suits; True when one ran."""
        now = self.clock()
        if now - self._last < self.every_s and gc.get_count()[0] < self.most_young:
            return False
        if self._due_since is None:
            self._due_since = now
        if now - self._due_since < self.idle_wait_s and not self.idle():
            return False
        gc.collect()
        self.collections += 1
        self._last, self._due_since = self.clock(), None
        return True

    async def run(self, tick_s: float = GC_TICK_S) -> None:
        """`start` (unless started), then `step` every `tick_s` until cancelled. The collector
        stays off until `stop`: turned back on, its first young collection visits everything
        made since `start` (a long pause for a busy orchestrator), so a service stops
        serving first."""
        if not self._on:
            self.start()
        while True:
            await asyncio.sleep(tick_s)  # a cadence, not synchronisation
            self.step()


def gc_pause_hook(log: logging.Logger) -> Callable[[str, dict[str, int]], None]:
    """A `gc.callbacks` hook logging (debug) each collection that stopped the event loop for
    GC_PAUSE_LOGGED_S or more: a suspect when a reply's time has a long tail."""
    began = [0.0]

    def hook(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        paused = time.perf_counter() - began[0]
        if paused >= GC_PAUSE_LOGGED_S:
            log.debug(
                "gc generation=%d pause_ms=%.1f collected=%d",
                info.get("generation", -1), 1e3 * paused, info.get("collected", 0),
            )  # fmt: skip

    return hook


async def done_by(deadline: float | None, aw: Awaitable[object]) -> bool:
    """Await `aw`, cancelled at `deadline` (event-loop time; None: no limit): False if the
    deadline cut it short. A TimeoutError of `aw`'s own (a NATS request's) is raised as is."""
    limit = asyncio.timeout_at(deadline)
    try:
        async with limit:
            await aw
    except TimeoutError:
        if not limit.expired():
            raise
        return False
    return True


#: One drain of queued messages holds the loop at most about this long between turns.
PACE_TURN_S = 0.0005


class Pacer:
    """Gives the event loop a turn while a handler drains queued work.

    nats-py hands a subscription's queued messages to its callback one after another without
    returning to the loop while its queue is not empty, so the task events of pipelines that
    end together would run as one step of several milliseconds, and a placement whose reply
    had already arrived would wait behind all of them. Pacing costs one loop turn per `turn_s`
    of drain."""

    def __init__(self, turn_s: float = PACE_TURN_S) -> None:
        self.turn_s = turn_s
        self._began: float | None = None
        #: Turns given (a gauge for benchmarks and tests).
        self.turns = 0

    async def pace(self, more: bool) -> None:
        """Call after each item; `more`: another item is already waiting (without pacing the
        handler would go on to it without the loop's turn)."""
        if not more:
            self._began = None  # the drain ends: the loop gets its turn anyway
            return
        now = time.perf_counter()
        if self._began is None:
            self._began = now
        elif now - self._began >= self.turn_s:
            self.turns += 1
            await asyncio.sleep(0)  # a turn for what became ready meanwhile
            self._began = time.perf_counter()


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for `event` at most `timeout_s`; True if it is set. A cancellation that lands in
    the same turn as the event is raised, not dropped (`asyncio.wait_for` before Python 3.12
    returns the result that won the race and drops the cancellation: a loop around it would
    never end, and whoever cancelled it wait for good)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
    me = asyncio.current_task()
    if me is not None and me.cancelling():
        raise asyncio.CancelledError
    return event.is_set()
