"""A replica whose start fails on NATS (JetStream not answering yet, as on a cluster still
electing its leaders) tries again when asked to (`--retry-connect`), and says so."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator

import pytest

from orchestrator.infra.natsserver import find_binary, free_port
from orchestrator.service import run_orchestrator


@pytest.fixture
def no_jetstream() -> Iterator[str]:
    """A real nats-server without JetStream: every start fails at its first KV bucket."""
    port = free_port()
    proc = subprocess.Popen(
        [find_binary(), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the server's own word that it listens
            if b"Server is ready" in line:
                break
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


async def test_failed_start_raises_without_retry(no_jetstream: str) -> None:
    with pytest.raises(Exception):  # noqa: B017 - whichever NATS error JetStream's absence is
        await asyncio.wait_for(run_orchestrator(no_jetstream, stop=asyncio.Event()), 60)


async def test_failed_start_is_tried_again(no_jetstream: str) -> None:
    stop, said = asyncio.Event(), asyncio.Event()
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        said.set()

    run = asyncio.create_task(run_orchestrator(no_jetstream, stop=stop, retry_start=True, say=say))
    await asyncio.wait_for(said.wait(), 60)
    assert not run.done()
    assert lines[0].startswith("starting failed: ") and "trying again in 0.5 s" in lines[0]
    stop.set()
    await asyncio.wait_for(run, 30)  # stops between tries, without raising
