"""booking_stress's injected failures: given together, each happens at its own time and is
reported with it (the report once gave every row the time of the one failure it injected)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from benchmarks.booking_stress import (
    FAULT_AGENTS,
    FAULT_KILL,
    FAULT_SERVER,
    LoadResult,
    faults_done,
    kill_rows,
    restart_rows,
    restart_server_later,
    server_rows,
)


def args(kill: float, agents: float, server: float) -> argparse.Namespace:
    return argparse.Namespace(
        kill_after=kill, restart_agents_after=agents, restart_server_after=server,
        stop_agents_after=0.0, stop_for=0.0, agent_processes=1, agents=50,
    )  # fmt: skip


def test_each_failure_is_reported_at_its_own_time() -> None:
    load = LoadResult(outcomes=[], wall_s=30.0, faults={FAULT_KILL: 6.0, FAULT_SERVER: 21.5})
    rows = [
        *kill_rows(args(6, 12, 16), load, []),
        *restart_rows(args(6, 12, 16), load, []),
        *server_rows(args(6, 12, 16), load),
    ]
    when = {str(r[0]): r[1] for r in rows if str(r[0]).endswith("at (s into the load)")}
    assert when == {
        "orchestrator-0 SIGKILLed at (s into the load)": "6.0",
        # asked for, but the load ended first
        "agents' processes SIGKILLed and restarted at (s into the load)": (
            "never (the load ended first)"
        ),
        "nats-server restarted at (s into the load)": "21.5",
    }
    assert not [r for r in rows if str(r[0]).startswith("submits sent again")]  # one row, apart
    assert kill_rows(args(0, 12, 16), load, []) == []  # not asked for: no rows
    assert restart_rows(args(6, 0, 16), load, []) == []
    assert server_rows(args(6, 12, 0), load) == []


async def test_a_failure_not_yet_due_is_called_off_and_left_out() -> None:
    async def at(s: float) -> float:
        return s

    done = asyncio.create_task(at(6.0))
    await done
    due = asyncio.Event()  # never set: this one's moment never comes
    pending = asyncio.create_task(due.wait())
    got = await faults_done({FAULT_KILL: done, FAULT_AGENTS: pending})
    assert got == {FAULT_KILL: 6.0}
    assert pending.cancelled()


class Broker:
    """Stands in for the embedded server: records its stops and starts."""

    def __init__(self, store_dir: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.store_dir = str(store_dir)
        self.calls: list[str] = []
        self.stopped = asyncio.Event()
        self._loop = loop

    def stop(self) -> None:
        self.calls.append("stop")
        self._loop.call_soon_threadsafe(self.stopped.set)

    def start(self) -> None:
        self.calls.append("start")


async def test_a_server_stopped_when_its_restart_is_called_off_is_started_again(
    tmp_path: Path,
) -> None:
    broker = Broker(tmp_path, asyncio.get_running_loop())
    restart = asyncio.create_task(restart_server_later(broker, 0.0, down_s=3600.0))  # type: ignore[arg-type]
    await broker.stopped.wait()
    assert await faults_done({FAULT_SERVER: restart}) == {}
    assert broker.calls == ["stop", "start"]
    with pytest.raises(asyncio.CancelledError):
        restart.result()
