"""`EmbeddedNats.traffic`: the server's own count of messages each named connection sent and
received (what the placement benchmark reports per pipeline), over a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest

from orchestrator.natsserver import EmbeddedNats, NatsServerError
from schemas.rpc import settle

pytestmark = pytest.mark.integration


async def test_traffic_counts_what_each_named_connection_sent_and_received(
    tmp_path: Path,
) -> None:
    with EmbeddedNats(store_dir=str(tmp_path / "nats"), monitor=True) as srv:
        before = await asyncio.to_thread(srv.traffic)
        assert "tx" not in before and "rx" not in before
        tx = await nats.connect(srv.url, name="tx")
        rx = await nats.connect(srv.url, name="rx")
        try:
            sub = await rx.subscribe("t.x")
            await settle(rx)  # the server has the subscription (one flush does not promise it)
            for i in range(3):
                await tx.publish("t.x", str(i).encode())
            await settle(tx)
            got = [(await sub.next_msg(timeout=5)).data for _ in range(3)]
            assert got == [b"0", b"1", b"2"]
            counts = await asyncio.to_thread(srv.traffic)
            assert counts["tx"] == (3, 0) and counts["rx"] == (0, 3)
        finally:
            await tx.close()
            await rx.close()


def test_traffic_needs_the_monitoring_port(tmp_path: Path) -> None:
    with (
        EmbeddedNats(store_dir=str(tmp_path / "nats")) as srv,
        pytest.raises(NatsServerError, match="monitor"),
    ):
        srv.traffic()


def test_the_monitoring_port_is_never_the_client_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free ports are probed one after another, each probe's socket closed before the next:
    the OS may give the same one twice, and a server told to use it for both would not start."""
    ports = iter([41001, 41001, 41001, 41002])
    monkeypatch.setattr("orchestrator.natsserver.free_port", lambda host="": next(ports))
    srv = EmbeddedNats(monitor=True)
    try:
        assert (srv.port, srv.monitor_port) == (41001, 41002)
    finally:
        srv.stop()  # never started: only its temporary store goes
