"""Reading JetStream KV buckets: following a watch (every cache the orchestrator keeps of a
bucket does this) and listing a bucket's keys."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.js.errors import NoKeysError

#: Times an empty key listing is asked again while the bucket says it holds values.
KEYS_ATTEMPTS = 5


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


async def all_keys(kv: Any) -> list[str] | None:
    """Every key of the bucket; None when it holds values but listing them kept failing.
    `kv.keys()` can come back empty on a busy server while the bucket holds values (its watch
    may end before the values arrive), so an empty answer is checked against the bucket's own
    count and asked again."""
    for _ in range(KEYS_ATTEMPTS):
        try:
            keys = list(await kv.keys())
        except NoKeysError:
            keys = []
        if keys or (await kv.status()).values == 0:
            return keys
    return None
