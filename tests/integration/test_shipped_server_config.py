"""The nats-server config shipped for operators (deploy/nats/single.conf) gives an orchestrator
what the server MARS starts itself gives it: an agent's crash is seen through the server's
disconnect advisory at once, not after its heartbeats stop. A real nats-server runs the
shipped file, changed only in its port and store directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import pytest

from orchestrator.infra.natsserver import find_binary, free_port, server_env
from orchestrator.infra.procs import tied_to_caller
from orchestrator.service import Orchestrator
from tests.conftest import REPO
from tests.integration.test_recovery import ClusterEvents, start_victim

pytestmark = pytest.mark.integration

SHIPPED = REPO / "deploy" / "nats" / "single.conf"


async def _until_ready(log: asyncio.StreamReader, kept: IO[bytes]) -> None:
    """Read the server's log (its stderr) into `kept` until it says it is ready."""
    said = b""
    while b"Server is ready" not in (line := await log.readline()):
        assert line, f"nats-server exited: {said[-2000:].decode(errors='replace')}"
        said += line
        kept.write(line)
    kept.write(line)


async def _drain(log: asyncio.StreamReader, kept: IO[bytes]) -> None:
    """Read the rest of the server's log into `kept`, so that a full pipe never stops it."""
    while chunk := await log.read(1 << 16):
        kept.write(chunk)


@contextlib.asynccontextmanager
async def shipped_server(tmp_path: Path) -> AsyncIterator[str]:
    """A nats-server on the shipped config, listening on a free port and storing under
    `tmp_path`; its URL once its log (stderr: the config names no log file) says it is
    ready."""
    text = SHIPPED.read_text()
    port = free_port()
    for was, now in (
        ("listen: 127.0.0.1:4222", f"listen: 127.0.0.1:{port}"),
        ("store_dir: /var/lib/mars/jetstream", f"store_dir: {tmp_path / 'jetstream'}"),
    ):
        assert text.count(was) == 1, f"{SHIPPED} no longer says {was!r}"
        text = text.replace(was, now)
    conf, log = tmp_path / "single.conf", tmp_path / "nats-server.log"
    conf.write_text(text)
    proc = await asyncio.create_subprocess_exec(
        find_binary(), "-c", str(conf),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=server_env(), preexec_fn=tied_to_caller(),
    )  # fmt: skip
    assert proc.stderr is not None
    drain: asyncio.Task[None] | None = None
    with log.open("wb", buffering=0) as kept:
        try:
            try:
                async with asyncio.timeout(10.0):
                    await _until_ready(proc.stderr, kept)
            except TimeoutError:
                raise AssertionError("nats-server not ready") from None
            drain = asyncio.create_task(_drain(proc.stderr, kept))
            yield f"nats://127.0.0.1:{port}"
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            async with asyncio.timeout(10.0):
                await proc.wait()
                if drain is not None:
                    await drain  # ends with the server: its stderr closed


async def test_an_agents_crash_is_seen_through_the_shipped_servers_advisory(
    tmp_path: Path,
) -> None:
    """The agent is killed outright: it is dead by the server's disconnect advisory
    (`cause: disconnect`), not by its heartbeats (1.5 s of silence). Before, the shipped
    config had no system account: no advisory reached the orchestrator, and only the
    heartbeats found the crash."""
    async with shipped_server(tmp_path) as url:
        orch = Orchestrator(url)
        await orch.start()
        events = ClusterEvents()
        await events.start(url)
        proc = start_victim(url, tmp_path, "victim")
        try:
            assert await orch.wait_for_agents(1, timeout=30.0) == 1
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            at, ev = await events.wait("agent_dead", "victim", timeout=10.0)
            assert ev.cause == "disconnect"  # the advisory, not the heartbeat timeout
            assert orch.recovery.stats["disconnect_advisories"] == 1
            assert at - killed < 1.0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            await events.stop()
            await orch.stop()
