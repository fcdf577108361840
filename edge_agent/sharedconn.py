"""One NATS connection for the agents of one process: an emulated fleet (`mars sim agents`).

A real agent owns its connection (its host's socket, its own disconnect advisory). An emulated
fleet runs its agents in one process on the host that also runs the broker and the
orchestrator; there, a socket per agent costs the host a read and a write per agent for every
burst of messages (an offer round reaches several agents at once), where one socket carries
the burst in one. The messages are the same either way: every agent keeps its own
subscriptions, subjects and replies. What changes: the broker sees one client for the fleet,
so the orchestrator judges its agents by heartbeats only (no per-agent disconnect advisory), and
a dropped connection takes every member offline together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS

from edge_agent.outbox import connect_agent

log = logging.getLogger("mars.agent")

#: Connection names of shared connections: not `mars-agent-<id>` (recovery.AGENT_CLIENT_PREFIX),
#: so the orchestrator never takes one for a single agent.
SHARED_CLIENT_PREFIX = "mars-agents-"

Callback = Callable[[], Awaitable[None]]


class SharedConnection:
    """Connected by its first member, closed by `close` (members only leave)."""

    def __init__(
        self, url: str, name: str, *, reconnect_base_s: float = 0.5, reconnect_max_s: float = 5.0
    ) -> None:
        self.url = url
        self.name = f"{SHARED_CLIENT_PREFIX}{name}"
        self._reconnect = (reconnect_base_s, reconnect_max_s)
        self.nc: NATS | None = None
        self._lock = asyncio.Lock()
        self._members: dict[str, tuple[Callback, Callback]] = {}

    @property
    def members(self) -> int:
        return len(self._members)

    async def join(self, member: str, disconnected: Callback, reconnected: Callback) -> NATS:
        """The connection (made now if this is the first member); `disconnected` and
        `reconnected` are called whenever it is lost and back, as an own connection's are."""
        async with self._lock:
            if self.nc is None or self.nc.is_closed:
                self.nc = await connect_agent(
                    self.url, self.name, self._disconnected, self._reconnected, *self._reconnect
                )
            self._members[member] = (disconnected, reconnected)
            return self.nc

    def leave(self, member: str) -> None:
        self._members.pop(member, None)

    async def close(self) -> None:
        self._members.clear()
        nc, self.nc = self.nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await nc.drain()
            if not nc.is_closed:  # drain refuses while reconnecting
                with contextlib.suppress(Exception):
                    await nc.close()

    async def _disconnected(self) -> None:
        await self._tell(0)

    async def _reconnected(self) -> None:
        await self._tell(1)

    async def _tell(self, which: int) -> None:
        for member, callbacks in list(self._members.items()):
            try:
                await callbacks[which]()
            except Exception:
                log.warning("%s: connection callback failed", member, exc_info=True)
