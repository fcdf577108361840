"""Following a KV watch ends when cancelled, even when the cancellation loses a race."""

from __future__ import annotations

import asyncio

from orchestrator.infra.kvwatch import follow


class Swallowing:
    """A watcher whose wait, cancelled, returns an entry instead: what `asyncio.wait_for`
    (inside nats-py's `updates`) does before Python 3.12 when an entry arrives together with
    the cancellation."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.calls = 0

    async def updates(self, timeout: float) -> str:
        self.calls += 1
        self.waiting.set()
        try:
            await asyncio.Event().wait()  # no entry comes on its own
        except asyncio.CancelledError:
            if self.calls > 1:
                raise  # only the first race is lost (so an unfixed watch can still be ended)
            return "entry"
        raise AssertionError("unreachable")


async def test_a_swallowed_cancellation_still_ends_the_watch() -> None:
    watcher = Swallowing()
    applied: list[str] = []
    task = asyncio.create_task(follow(watcher, applied.append))
    await watcher.waiting.wait()
    task.cancel()
    # bounded, and without passing our own cancellation on: unfixed, the watch goes on for ever
    done, _ = await asyncio.wait({task}, timeout=5)
    if not done:
        task.cancel()
    assert done == {task} and task.cancelled()
    assert watcher.calls == 1 and applied == []
