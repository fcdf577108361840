"""A loop around `eventloop.wait_event` ends when cancelled, even when the cancellation lands
in the same turn as the event it waits for."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.infra.eventloop import wait_event


async def test_a_cancel_in_the_same_turn_as_the_wake_is_not_dropped() -> None:
    wake, waiting = asyncio.Event(), asyncio.Event()

    async def loop() -> None:
        while True:
            wake.clear()
            waiting.set()  # (heard once its wait below has begun)
            await wait_event(wake, 10.0)

    task = asyncio.create_task(loop())
    await waiting.wait()
    wake.set()  # its wait is woken...
    task.cancel()  # ...and cancelled in the same turn
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5.0)


async def test_it_says_whether_the_event_was_set() -> None:
    ev = asyncio.Event()
    assert await wait_event(ev, 0.01) is False
    ev.set()
    assert await wait_event(ev, 0.01) is True
