"""A server going away is routine (a restart, an upgrade): the connections of the
orchestrator and of its clients log failed reconnect attempts at debug, not as nats-py's
"nats: encountered error" with a traceback per attempt (printed to stderr by a process that
set up no logging: `booking_stress --restart-server-after` printed a dozen)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.service import Orchestrator
from transport.client import Client

pytestmark = pytest.mark.integration


class Heard(logging.Handler):
    """Sets an event for each logger once it logs a refused reconnect ("nats: ..." naming a
    connection error)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.events = {n: asyncio.Event() for n in names}

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.name in self.events and msg.startswith("nats: ") and "Error" in msg:
            self.events[record.name].set()


async def test_a_lost_server_is_logged_at_debug_not_as_tracebacks(
    nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    heard = Heard(["mars.client", "mars.orchestrator"])
    root = logging.getLogger()
    root.addHandler(heard)
    client = await Client.connect(nats_server.url, reconnects=-1)
    orch = Orchestrator(nats_server.url)
    await orch.start()
    try:
        nats_server.stop()
        async with asyncio.timeout(20):
            for ev in heard.events.values():
                await ev.wait()  # each has failed to reconnect at least once
        said = [r for r in caplog.records if r.name in heard.events and "nats: " in r.message]
        assert said and all(r.levelno == logging.DEBUG and r.exc_info is None for r in said)
        assert not [r for r in caplog.records if r.name.startswith("nats")], "nats-py's own"
    finally:
        root.removeHandler(heard)
        await client.nc.close()
        await orch.stop()
