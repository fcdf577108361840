"""A `mars sim up` that fails, wherever it fails, leaves none of the processes it started
running: those its state file names and those it never got to record. Real processes (a
nats-server, the link emulator, an orchestrator, an agent); the failure is injected where
`up` records a process it has just started."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from sim import launcher

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: failing
hub: cloud
sites:
  - {name: cloud, tier: cloud, lan: none}
agents:
  - {id: solo, site: cloud, devices: [{kind: cpu, slots: 1}]}
"""


@pytest.mark.parametrize("failing_role", ["nats", "agent"])
def test_a_failed_up_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_role: str
) -> None:
    """`up` fails as it records the nats-server (the first process it starts) or the agent
    (the last): what it recorded is stopped through its state file, and the process it had
    started but not recorded (not known for ours: a look at a process just started, say)
    is stopped too. Before, the latter was left running."""
    topo = tmp_path / "topo.yaml"
    topo.write_text(TOPOLOGY)
    run = tmp_path / "run"
    started: list[subprocess.Popen[bytes]] = []
    record = launcher.SimState.record

    def failing(state: launcher.SimState, role: str, name: str, proc: Any, log: Path) -> None:
        started.append(proc)
        if role == failing_role:
            raise launcher.SimError(f"injected: {role} {name} not seen")
        record(state, role, name, proc, log)

    monkeypatch.setattr(launcher.SimState, "record", failing)
    with pytest.raises(launcher.SimError, match="injected"):
        launcher.up(topo, run, timeout=30.0)
    # nats-server, then the link emulator, the orchestrator and the agent
    assert len(started) == {"nats": 1, "agent": 4}[failing_role]
    assert [p.pid for p in started if p.poll() is None] == []  # all ended, all reaped
    assert not (run / launcher.STATE_FILE).exists()
