"""Following a JetStream KV watch: every cache the orchestrator keeps of a bucket does this."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def follow(watcher: Any, apply: Callable[[Any], None], idle_s: float = 60.0) -> None:
    """Feed every entry of `watcher` to `apply` until cancelled (idle timeouts are not ends;
    the None marker after the initial values is skipped)."""
    while True:
        try:
            entry = await watcher.updates(timeout=idle_s)
        except asyncio.CancelledError:
            raise
        except Exception:
            continue  # idle timeout
        me = asyncio.current_task()
        if me is not None and me.cancelling():
            # asyncio.wait_for (inside `updates`, Python < 3.12) returns an entry that won a
            # race against our cancellation and drops the cancellation: honour it here, or
            # whoever cancelled us waits for ever
            raise asyncio.CancelledError
        if entry is not None:
            apply(entry)
