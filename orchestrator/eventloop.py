"""Which event loop the `mars` processes run on.

Every MARS process spends most of its time in the event loop and in socket writes (each NATS
message is a callback and a `send`), so it runs on uvloop where it is installed (a core
dependency on Linux and macOS): on the 2-core reference machine a request/reply round trip
between two processes drops from ~0.63 to ~0.37 ms. `MARS_LOOP=asyncio` keeps the standard
loop, e.g. to rule uvloop out when chasing a bug.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable, Coroutine
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
#: Young objects counted before a collection, and the older generations' multipliers.
GC_THRESHOLDS = (50_000, 20, 100)


def quiet_gc() -> None:
    """For a long-running service once it is up: what start-up made is never scanned again
    (`gc.freeze`), and collections come less often. Every collection stops the event loop:
    a full one of a process holding 100 emulated agents took 22-55 ms, a dozen times a minute,
    and held every offer to those agents that long."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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


#: One drain of queued messages holds the loop at most about this long between turns.
PACE_TURN_S = 0.0005


class Pacer:
    """Gives the event loop a turn while a handler drains queued work.

    nats-py hands a subscription's queued messages to its callback one after another without
    returning to the loop while its queue is not empty, so the 40 task events of pipelines that
    ended together ran as one step of several milliseconds, and a placement whose reply had
    already arrived waited behind all of them (on the 2-core reference machine, ~85 such steps
    over 2 ms in a 600-submission run). Pacing costs one loop turn per `turn_s` of drain."""

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
