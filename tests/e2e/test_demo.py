"""`mars demo` really runs: exit 0, a succeeded pipeline, and nothing left running."""

from __future__ import annotations

import re
import subprocess
import sys

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
        [sys.executable, "-m", "orchestrator.cli", "demo"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "cluster: 3 agents" in out
    assert "(emulated)" in out  # the accelerator is declared, never passed off as measured
    assert re.search(r"pipeline \w+ succeeded", out), out
    assert re.search(r"detect\s+succeeded.*top1=class\d", out), out
    port = re.search(r"nats://127\.0\.0\.1:(\d+)", out)
    assert port is not None
    assert _leftovers(f"127.0.0.1:{port.group(1)}") == []
    assert _leftovers(f"-p {port.group(1)}") == []
