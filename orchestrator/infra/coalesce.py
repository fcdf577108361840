"""At most one message per sender per interval, the latest winning: a flood from one identity
costs a dict write per message, and what it last said is still applied.

An advert carries an agent's whole state, so dropping all but the latest of a burst loses
nothing; applying every one of a flood would let one agent (its permissions let it advertise
only as itself, as often as it likes) take the replica's loop from the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

M = TypeVar("M")
#: Senders remembered at once: a fleet's worth; beyond it the memory of who spoke is reset.
MAX_SENDERS = 100_000


class Coalescer(Generic[M]):
    def __init__(
        self,
        apply: Callable[[M], Awaitable[None]],
        min_gap_s: float,
        clock: Callable[[], float],
        spawn: Callable[[Awaitable[None]], object],
    ) -> None:
        self.apply = apply
        self.min_gap_s = min_gap_s
        self.clock = clock
        self.spawn = spawn
        self._last: dict[str, float] = {}
        self._pending: dict[str, M] = {}
        #: Messages replaced by a later one from the same sender before being applied.
        self.coalesced = 0

    async def offer(self, sender: str, msg: M) -> None:
        now = self.clock()
        if sender in self._pending:
            self._pending[sender] = msg  # the timer below applies the latest
            self.coalesced += 1
            return
        wait = self._last.get(sender, -1e18) + self.min_gap_s - now
        if wait <= 0:
            if len(self._last) >= MAX_SENDERS:
                self._last.clear()  # (only spaced messages are let through sooner)
            self._last[sender] = now
            await self.apply(msg)
            return
        self._pending[sender] = msg
        asyncio.get_running_loop().call_later(wait, self._due, sender)

    def _due(self, sender: str) -> None:
        msg = self._pending.pop(sender, None)
        if msg is not None:
            self._last[sender] = self.clock()
            self.spawn(self.apply(msg))

    def forget(self, sender: str) -> None:
        """A departed sender: nothing kept of it (the map is bounded by the live fleet)."""
        self._last.pop(sender, None)
