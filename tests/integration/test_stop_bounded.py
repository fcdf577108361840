"""Stopping an orchestrator is bounded: its last writes (learned corrections, gathered
results, deferred releases) get FINAL_WRITES_S in all, none without NATS; and a second
SIGTERM while a `mars` process stops ends it at once (over a real nats-server)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator import service
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.predictor.history import MIN_SAVE_N
from orchestrator.service import Orchestrator

pytestmark = pytest.mark.integration

TRACKS = 200


def learned(orch: Orchestrator, tracks: int) -> None:
    """`tracks` corrections learned and not written yet."""
    assert orch.history is not None
    for i in range(tracks):
        sig, dev = f"sig{i:04d}", "a1:cpu0"
        for k in range(MIN_SAVE_N):
            orch.predictor.corrections.observe(sig, dev, 1.0, 1.5, 10.0 + k)
        orch.history.mark(sig, dev)


async def test_stopping_without_nats_does_not_wait_out_each_write(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "FINAL_WRITES_S", 1.0)
    orch = Orchestrator(nats_server.url)
    await orch.start()
    learned(orch, TRACKS)
    await asyncio.to_thread(nats_server.stop)  # the broker is gone while it stops
    t0 = time.monotonic()
    await asyncio.wait_for(orch.stop(), 20.0)  # each write alone waits its timeout (~5 s)
    assert time.monotonic() - t0 < 10.0


async def test_a_stop_writes_everything_learned_some_at_once(nats_url: str) -> None:
    orch = Orchestrator(nats_url)
    await orch.start()
    learned(orch, TRACKS)
    assert orch.history is not None
    await asyncio.wait_for(orch.stop(), service.FINAL_WRITES_S + 5.0)
    assert orch.history.writes == TRACKS  # all written, some at once

    again = Orchestrator(nats_url)  # a new replica reads them back
    await again.start()
    try:
        assert again.predictor.corrections.get("sig0000", "a1:cpu0") is not None
        assert again.predictor.corrections.get(f"sig{TRACKS - 1:04d}", "a1:cpu0") is not None
    finally:
        await again.stop()


def test_a_second_sigterm_while_stopping_ends_the_process(tmp_path: Path) -> None:
    """A stop that hangs (here: one that never ends) is cut short by a second signal."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import asyncio, sys\n"
        "from console.cli import _run_until_signal\n"
        "async def main(stop, started):\n"
        "    started.set()  # up: a stop from here on is the service's own\n"
        "    print('up', flush=True)\n"
        "    await stop.wait()\n"
        "    print('stopping', flush=True)\n"
        "    await asyncio.Event().wait()  # a stop that never ends\n"
        "sys.exit(_run_until_signal(main))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline().strip() == "stopping"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "again: exiting now" in err
    finally:
        proc.kill()
        proc.wait()


async def test_a_task_that_will_not_be_cancelled_does_not_hold_the_stop(
    nats_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service, "STOP_TASKS_S", 0.5)
    orch = Orchestrator(nats_url)
    await orch.start()
    running, release = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        running.set()
        while not release.is_set():  # swallows every cancellation until released
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    task = orch.spawn(stubborn())
    await running.wait()
    try:
        await asyncio.wait_for(orch.stop(), 10.0)  # returned, though the task still runs
        assert not task.done()
        assert "stubborn" in caplog.text  # named as what did not end
    finally:
        release.set()
        await task
