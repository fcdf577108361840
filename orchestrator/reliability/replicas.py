"""Which other orchestrator replicas are up. The API is a queue group, so one request reaches
one replica; each replica holds its own pipelines in memory, so a `list` must ask every
replica. Each says hello when it starts (the others answer with theirs), again every few
seconds, and goodbye when it stops; one not heard for three hellos is taken to be gone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from schemas import subjects
from schemas.codec import DecodeError, decode, encode
from schemas.failover import ReplicaHello

log = logging.getLogger("mars.replicas")

HELLO_EVERY_S = 5.0
#: Hellos missed before a replica is taken to be gone.
MISSED_HELLOS = 3


class Replicas:
    def __init__(
        self, owner: str, mono: Callable[[], float], hello_every_s: float = HELLO_EVERY_S
    ) -> None:
        self.owner = owner
        self.mono = mono
        self.hello_every_s = hello_every_s
        #: Other replicas heard from: owner name -> when last heard (monotonic clock).
        self.heard: dict[str, float] = {}
        self._nc: Any = None
        self._changed = asyncio.Condition()

    async def start(self, nc: Any) -> None:
        self._nc = nc
        await nc.subscribe(subjects.REPLICA_HELLO, cb=self._on_hello)

    async def announce(self) -> None:
        """The first hello, once this replica serves: the others answer with theirs."""
        await self._say(ReplicaHello(owner=self.owner, answer=True))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.hello_every_s)  # the hello's cadence
            with contextlib.suppress(Exception):  # offline: said again at the next beat
                await self._say(ReplicaHello(owner=self.owner))

    async def leave(self) -> None:
        with contextlib.suppress(Exception):
            await self._say(ReplicaHello(owner=self.owner, leaving=True))

    async def _say(self, hello: ReplicaHello) -> None:
        if self._nc is not None and self._nc.is_connected:
            await self._nc.publish(subjects.REPLICA_HELLO, encode(hello))

    async def _on_hello(self, msg: Msg) -> None:
        try:
            hello = decode(msg.data, ReplicaHello)
        except DecodeError as exc:  # published, not requested: nobody to answer
            log.warning("ignored a malformed replica hello: %s", exc.message)
            return
        if hello.owner == self.owner:
            return
        if hello.leaving:
            self.heard.pop(hello.owner, None)
        else:
            self.heard[hello.owner] = self.mono()
            if hello.answer:
                await self._say(ReplicaHello(owner=self.owner))
        async with self._changed:
            self._changed.notify_all()

    def up(self) -> list[str]:
        """The other replicas heard from lately, by name."""
        since = self.mono() - MISSED_HELLOS * self.hello_every_s
        for owner in [o for o, t in self.heard.items() if t < since]:
            del self.heard[owner]
        return sorted(self.heard)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> None:
        """In-process wait until `predicate` holds, re-checked at every hello (tests)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)
