"""`EmbeddedNats.traffic`: the server's own count of messages each named connection sent and
received (what the placement benchmark reports per pipeline), over a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path

import nats
import pytest

from orchestrator.infra.natsserver import (
    EmbeddedNats,
    NatsServerError,
    go_procs,
    server_env,
    server_procs,
)
from transport.rpc import settle

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


async def test_stream_writes_count_every_message_stored_deleted_or_not(tmp_path: Path) -> None:
    """What the placement benchmark reports as JetStream stores per pipeline: each stream's
    last sequence number, so a KV key written three times counts three, even with history 1."""
    with EmbeddedNats(store_dir=str(tmp_path / "nats"), monitor=True) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="S", subjects=["s.>"])
            kv = await js.create_key_value(bucket="B", history=1)
            before = await asyncio.to_thread(srv.stream_writes)
            assert before == {"S": 0, "KV_B": 0}
            for i in range(2):
                await js.publish("s.x", str(i).encode())
            for i in range(3):
                await kv.put("k", str(i).encode())
            await kv.delete("k")
            after = await asyncio.to_thread(srv.stream_writes)
            assert after == {"S": 2, "KV_B": 4}  # three values and the delete marker
        finally:
            await nc.close()


def test_traffic_needs_the_monitoring_port(tmp_path: Path) -> None:
    with (
        EmbeddedNats(store_dir=str(tmp_path / "nats")) as srv,
        pytest.raises(NatsServerError, match="monitor"),
    ):
        srv.traffic()
    with (
        EmbeddedNats(store_dir=str(tmp_path / "nats2")) as srv,
        pytest.raises(NatsServerError, match="monitor"),
    ):
        srv.stream_writes()


def test_the_monitoring_port_is_never_the_client_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free ports are probed one after another, each probe's socket closed before the next:
    the OS may give the same one twice, and a server told to use it for both would not start."""
    ports = iter([41001, 41001, 41001, 41002])
    monkeypatch.setattr("orchestrator.infra.natsserver.free_port", lambda host="": next(ports))
    srv = EmbeddedNats(monitor=True)
    try:
        assert (srv.port, srv.monitor_port) == (41001, 41002)
    finally:
        srv.stop()  # never started: only its temporary store goes


def _varz(srv: EmbeddedNats) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{srv.host}:{srv.monitor_port}/varz", timeout=10) as r:
        out: dict[str, object] = json.load(r)
    return out


def test_the_servers_go_procs_are_a_quarter_of_the_cores_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's own account of its GOMAXPROCS: a quarter of the machine's cores (at least
    one) by default, `procs` when given, the environment's GOMAXPROCS when it sets one."""
    monkeypatch.delenv("GOMAXPROCS", raising=False)
    cores = os.cpu_count() or 1
    with EmbeddedNats(store_dir=str(tmp_path / "a"), monitor=True) as srv:
        assert _varz(srv)["gomaxprocs"] == srv.procs == max(1, cores // 4)
    with EmbeddedNats(store_dir=str(tmp_path / "b"), monitor=True, procs=3) as srv:
        assert _varz(srv)["gomaxprocs"] == 3
    monkeypatch.setenv("GOMAXPROCS", "2")
    with EmbeddedNats(store_dir=str(tmp_path / "c"), monitor=True) as srv:
        assert _varz(srv)["gomaxprocs"] == srv.procs == 2


@pytest.mark.parametrize(
    ("cores", "procs"), [(1, 1), (2, 1), (4, 1), (7, 1), (8, 2), (16, 4), (64, 16)]
)
def test_go_procs_is_a_quarter_of_the_cores_and_at_least_one(cores: int, procs: int) -> None:
    assert go_procs(cores) == procs


@pytest.mark.parametrize(("env", "procs"), [("3", 3), ("0", None), ("-1", None), ("x", None)])
def test_the_environments_gomaxprocs_is_kept_when_it_is_a_count(
    monkeypatch: pytest.MonkeyPatch, env: str, procs: int | None
) -> None:
    monkeypatch.setenv("GOMAXPROCS", env)
    assert server_procs() == (procs if procs is not None else go_procs())
    assert server_env()["GOMAXPROCS"] == str(server_procs())
    with pytest.raises(ValueError, match="procs"):
        EmbeddedNats(procs=0)
