"""`eventloop.done_by`: an awaitable cut short at a deadline (a stopping service's last
writes), told apart from a timeout of the awaitable's own."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.infra.eventloop import done_by


async def test_work_that_ends_in_time_is_done() -> None:
    loop = asyncio.get_running_loop()
    assert await done_by(loop.time() + 5.0, asyncio.sleep(0))
    assert await done_by(None, asyncio.sleep(0))


async def test_work_past_the_deadline_is_cut_short() -> None:
    loop = asyncio.get_running_loop()
    never = asyncio.Event()
    assert not await done_by(loop.time(), never.wait())  # a deadline already passed


async def test_a_timeout_of_the_work_s_own_is_not_taken_for_the_deadline() -> None:
    loop = asyncio.get_running_loop()

    async def request() -> None:
        raise TimeoutError("nats: timeout")

    with pytest.raises(TimeoutError, match="nats: timeout"):
        await done_by(loop.time() + 5.0, request())
