"""An embedded nats-server started again on the same store is ready only when the new
process says so: the log it appends to still holds the last one's "Server is ready"."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import nats
import pytest

from orchestrator.infra.natsserver import EmbeddedNats, NatsServerError

#: Stands in for a nats-server that is slow to get ready: it accepts connections on the
#: port it is given at once, and never logs that it is ready.
NOT_READY_YET = """\
import signal, socket, sys
args = sys.argv[1:]
host, port = args[args.index("-a") + 1], int(args[args.index("-p") + 1])
log = args[args.index("-l") + 1]
with open(log, "a") as fh:
    fh.write("[1] Starting nats-server (stand-in)\\n")
srv = socket.create_server((host, port))
signal.pause()  # until stopped
"""


def test_the_last_servers_ready_line_does_not_make_a_new_one_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "nats")
    first = EmbeddedNats(store_dir=store).start()
    first.stop()
    assert "Server is ready" in (Path(store) / "nats-server.log").read_text()

    stand_in = tmp_path / "nats-server"
    stand_in.write_text(f"#!{sys.executable}\n{NOT_READY_YET}")
    stand_in.chmod(0o755)
    monkeypatch.setenv("MARS_NATS_SERVER", str(stand_in))
    second = EmbeddedNats(store_dir=store, port=first.port, ready_timeout=1.5)
    try:
        with pytest.raises(NatsServerError, match="not ready"):
            second.start()
    finally:
        second.stop()  # (stopped already, unless the test fails)
    assert second.proc is None  # stopped as start gave up
    assert second.log_tail() == "[1] Starting nats-server (stand-in)\n"  # this start's lines


async def test_a_server_started_again_on_its_store_serves_and_keeps_its_streams(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "nats")
    server = EmbeddedNats(store_dir=store).start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="KEPT", subjects=["kept.>"])
        await js.publish("kept.a", b"1")
        await nc.close()
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)  # the old log is left as it was
        nc = await nats.connect(server.url)
        try:
            info = await nc.jetstream().stream_info("KEPT")
            assert info.state.messages == 1
        finally:
            await nc.close()
    finally:
        server.stop()
