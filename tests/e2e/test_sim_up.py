"""`mars sim up` starts a small topology as real processes behind emulated links, a pipeline
runs over them, agents measure the emulated links themselves, and `mars sim down` leaves no
process behind."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from orchestrator.infra.natsserver import server_procs
from schemas import subjects
from schemas.agent import AgentAdvert
from schemas.codec import decode, encoding_of
from sim import launcher

pytestmark = pytest.mark.e2e

TOPOLOGY = """
name: e2e
hub: cloud
link_probe_every_s: 1
sites:
  - {name: cloud, tier: cloud, lan: none}
  - {name: edge, tier: edge, lan: none}
links:
  - {between: [edge, cloud], latency_ms: 40, jitter_ms: 0, bandwidth_mbps: 20}
agents:
  - {id: cloud, site: cloud, devices: [{kind: cpu, slots: 2}]}
  - {id: edge, site: edge, replicas: 2, devices: [{kind: cpu, slots: 1}]}
"""

PIPELINE = """
name: over-the-wan
tasks:
  - id: capture
    run: {kind: synthetic, mode: sleep, seconds: 0.05, output_bytes: 100000}
    requires: {tiers: [edge]}
  - id: aggregate
    run: {kind: synthetic, mode: sleep, seconds: 0.05}
    requires: {tiers: [cloud]}
    deps: [capture]
"""


async def _mars(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "console.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _measured_latencies(
    url: str, agent_id: str, to_site: str, band: tuple[float, float], timeout: float
) -> list[float]:
    """Latencies the agent itself measured to `to_site`, from its adverts that carry one, up to
    the first inside `band` (or all seen within `timeout`). A first round of probes that met a
    busy moment of the host reads high; the agent's later rounds correct it."""
    nc = await nats.connect(url)
    seen: list[float] = []
    inside = asyncio.Event()

    async def on_advert(msg: Msg) -> None:
        adv = decode(msg.data, AgentAdvert, encoding_of(msg.headers))
        for link in adv.links:
            if adv.agent_id == agent_id and link.to_site == to_site and link.measured:
                seen.append(link.latency_ms)
                if band[0] <= link.latency_ms <= band[1]:
                    inside.set()

    try:
        await nc.subscribe(subjects.ALL_ADVERTS, cb=on_advert)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(inside.wait(), timeout)
        return seen
    finally:
        await nc.close()


async def test_sim_up_runs_a_pipeline_and_down_stops_everything(tmp_path: Path) -> None:
    topo = tmp_path / "topo.yaml"
    topo.write_text(TOPOLOGY)
    pipe = tmp_path / "pipe.yaml"
    pipe.write_text(PIPELINE)
    run = tmp_path / "run"
    recorded: list[int] = []
    try:
        rc, out, err = await _mars("sim", "up", str(topo), "--dir", str(run), "--timeout", "30")
        assert rc == 0, out + err
        state = launcher.SimState.load(run)
        recorded = [p.pid for p in state.processes]
        assert sorted(p.role for p in state.processes) == [
            "agent", "agent", "agent", "linkemu", "nats", "orchestrator",
        ]  # fmt: skip
        assert sorted(launcher.pids(run)) == sorted(recorded)
        nats_pid = next(p.pid for p in state.processes if p.role == "nats")
        environ = Path(f"/proc/{nats_pid}/environ").read_bytes().split(b"\0")
        assert f"GOMAXPROCS={server_procs()}".encode() in environ  # the broker's share
        assert state.links["edge-0"]["profile"]["latency_ms"] == 40.0

        rc, out, err = await _mars("submit", str(pipe), "--wait", "--nats", state.nats_url)
        assert rc == 0, out + err
        assert "succeeded" in out

        # the edge agent's own probes see the emulated path: 40 ms one way (edge -> hub)
        band = (36.0, 48.0)
        seen = await _measured_latencies(state.nats_url, "edge-0", "cloud", band, timeout=15.0)
        print(f"measured edge->cloud latency {seen} ms (emulated 40)")
        assert seen and band[0] <= seen[-1] <= band[1], seen

        rc, out, err = await _mars("sim", "down", "--dir", str(run))
        assert rc == 0, out + err
        assert "stopped 6 processes" in out
        assert launcher.pids(run) == []
        assert not (run / launcher.STATE_FILE).exists()
        for pid in recorded:
            assert not launcher.alive(pid), pid
    finally:
        if (run / launcher.STATE_FILE).exists():
            launcher.down(run, grace=2.0)
