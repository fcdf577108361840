"""Work spawned at a submit's end (the record, the commits) starts after the reply's write."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from orchestrator.api import submissions


async def test_work_after_a_reply_waits_for_the_reply_s_write() -> None:
    """Spawned before the reply is sent, the record and the commits still start after it:
    nats-py's flusher, woken by the reply, runs at the loop's next turn, after what was
    scheduled earlier; `after_reply` lets it go first. A wrapper stopped before its work
    started closes it (no coroutine left unawaited)."""
    events: list[str] = []

    async def work() -> None:
        events.append("work")

    task = asyncio.ensure_future(submissions.after_reply(work()))
    loop = asyncio.get_running_loop()
    loop.call_soon(events.append, "reply written")  # what the reply's send wakes
    await task
    assert events == ["reply written", "work"]

    never = work()
    stopped = asyncio.ensure_future(submissions.after_reply(never))
    await asyncio.sleep(0)
    stopped.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopped
    assert inspect.getcoroutinestate(never) == "CORO_CLOSED"  # no "never awaited" warning
    assert events == ["reply written", "work"]
