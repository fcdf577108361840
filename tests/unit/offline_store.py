"""A booking store with no NATS behind it, for unit tests that set its cache by hand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from orchestrator.reservations.store import BookingStore


@contextlib.asynccontextmanager
async def offline_store(**kw: Any) -> AsyncIterator[BookingStore]:
    """The store; the task that writes deferred releases (which `defer_release` starts, and
    which would find no bucket) is stopped at the end."""
    store = BookingStore(js=None, **kw)
    try:
        yield store
    finally:
        if store._flusher is not None:
            store._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await store._flusher
