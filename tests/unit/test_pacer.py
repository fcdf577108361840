"""A handler draining queued work gives the event loop turns (orchestrator/infra/eventloop.py)."""

from __future__ import annotations

import asyncio

from orchestrator.infra.eventloop import Pacer


async def _drain(pacer: Pacer, items: int, seen: list[str]) -> None:
    for i in range(items):
        seen.append(f"item{i}")
        await pacer.pace(i < items - 1)  # `more`: another item waits behind this one


async def test_a_long_drain_lets_work_that_became_ready_run_between_items() -> None:
    seen: list[str] = []
    pacer = Pacer(turn_s=0.0)  # every item is over the turn
    drain = asyncio.create_task(_drain(pacer, 5, seen))
    other = asyncio.create_task(asyncio.sleep(0, result=None))
    other.add_done_callback(lambda _t: seen.append("other"))
    await asyncio.gather(drain, other)
    assert seen.index("other") < seen.index("item4")  # not left until the drain was over
    assert pacer.turns == 3  # after items 1-3: the first starts the turn, the last ends it


async def test_a_short_drain_and_a_last_item_keep_the_loop() -> None:
    seen: list[str] = []
    pacer = Pacer(turn_s=3600.0)
    drain = asyncio.create_task(_drain(pacer, 5, seen))
    other = asyncio.create_task(asyncio.sleep(0))
    other.add_done_callback(lambda _t: seen.append("other"))
    await asyncio.gather(drain, other)
    assert seen == [f"item{i}" for i in range(5)] + ["other"]  # one step: no turn was due
    assert pacer.turns == 0
    await pacer.pace(False)  # the end of a drain gives no turn of its own
    assert pacer.turns == 0
