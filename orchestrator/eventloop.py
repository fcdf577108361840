"""Which event loop the `mars` processes run on.

Every MARS process spends most of its time in the event loop and in socket writes (each NATS
message is a callback and a `send`), so it runs on uvloop where it is installed (a core
dependency on Linux and macOS): on the 2-core reference machine a request/reply round trip
between two processes drops from ~0.63 to ~0.37 ms. `MARS_LOOP=asyncio` keeps the standard
loop, e.g. to rule uvloop out when chasing a bug.
"""

from __future__ import annotations

import asyncio
import os
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
