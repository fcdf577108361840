"""`mars demo` really runs: exit 0, a succeeded pipeline, and nothing left running."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e


def _leftovers(marker: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if marker in cmd:
            out.append(cmd)
    return out


def test_demo_succeeds_and_stops_everything() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "console.cli", "demo"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "cluster: 3 agents" in out
    assert "(emulated)" in out  # the accelerator is declared, never passed off as measured
    assert re.search(r"pipeline \w+ succeeded", out), out
    # real data through every step, and a score a person can check (the model card's own)
    assert re.search(r"classify\s+succeeded\s+edge-accel", out), out
    assert "score, read back from the cloud step's output: 353 of 360 digits right" in out, out
    port = re.search(r"nats://127\.0\.0\.1:(\d+)", out)
    assert port is not None
    assert _leftovers(f"127.0.0.1:{port.group(1)}") == []
    assert _leftovers(f"-p {port.group(1)}") == []


def _wait_gone(pid: int, timeout: float) -> bool:
    """Whether process `pid` has ended within `timeout` (woken by its exit, not polled)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def _nats_servers_under(path: Path) -> list[int]:
    return [
        p.pid for p in psutil.process_iter(["cmdline"])
        if str(path) in " ".join(p.info["cmdline"] or []) and "nats-server" in p.info["cmdline"][0]
    ]  # fmt: skip


def test_demo_stopped_by_sigterm_stops_everything_and_removes_its_files(tmp_path: Path) -> None:
    """A service manager, `timeout` or `kill` stops a demo with SIGTERM: it stops as on
    Ctrl-C (exit 130), its nats-server, orchestrator and agents with it, and its temporary
    directories are removed. SIGTERM ended Python at once: the broker kept its port and its
    store, and the directories stayed."""
    slow = tmp_path / "slow.yaml"
    slow.write_text(
        "name: slow\ntasks:\n  - id: wait\n    run: {kind: synthetic, mode: sleep, seconds: 60}\n"
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "console.cli", "demo", "--pipeline", str(slow),
         "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the pipeline is placed and its one task runs for a minute
            seen.append(line)
            if line.startswith("plan ("):
                break
        else:
            pytest.fail("".join(seen))
        servers = _nats_servers_under(tmp)
        port = re.search(r"nats://127\.0\.0\.1:(\d+)", "".join(seen))
        assert len(servers) == 1 and port is not None, seen
        assert _leftovers(f"127.0.0.1:{port.group(1)}")  # the orchestrator and the agents
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        assert proc.wait(30) == 130, "".join(seen) + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "interrupted" in out and "all processes stopped" in out, out
    assert _wait_gone(servers[0], 10.0)
    assert _leftovers(f"127.0.0.1:{port.group(1)}") == []
    assert sorted(p.name for p in tmp.iterdir()) == []  # mars-demo-*, mars-nats-* removed
