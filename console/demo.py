"""`mars demo`: a whole MARS installation on one machine, one pipeline through it.

Starts an embedded nats-server, an orchestrator and three agents as separate processes (an edge
CPU, an edge accelerator that is *emulated* — declared, not measured — and a cloud CPU), and
runs the digits example on real data: the UCI handwritten digits the package carries go in as
the pipeline's input, the edge decodes and scales them, the accelerator runs the project's own
ONNX classifier, the cloud scores it; no step sleeps. It prints the plan, the actual timeline,
each output, and the score read back from the cloud step's output. Everything it started is
stopped on exit and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from console import inputs
from console.fetch import fetch, find
from console.pipeline_files import load_pipeline
from console.report import plan_table, timeline_table
from edge_agent.digits import DATA_FILE, confusion_table
from orchestrator.infra import eventloop
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.infra.procs import spawn, stop_all, terminate_as_interrupt
from schemas.api import StatusReply
from schemas.pipeline import PipelineInput
from transport import connect
from transport.client import Client

# Declared link costs between the demo's sites (EdgeCloudSim-style defaults: WAN 100 ms,
# 25 Mbps; these are configuration, not measurements).
WAN = {"latency_ms": 100.0, "bandwidth_mbps": 25.0, "cost_per_gb": 0.09}

AGENTS: dict[str, dict[str, object]] = {
    "edge-cpu": {
        "site": "edge-a",
        "tier": "edge",
        "cpu_slots": 1,
        "links": [{"to_site": "cloud", **WAN}],
    },
    "edge-accel": {
        "site": "edge-a",
        "tier": "edge",
        "probe_cpu": False,
        "devices": [
            {
                "device_id": "npu0",
                "kind": "npu",
                "slots": 1,
                "memory_mb": 4096.0,
                "gflops": 80.0,
                "provider": "CPUExecutionProvider",
                "emulated": True,
                "model_name": "emulated edge NPU (runs on this host's CPU)",
            }
        ],
        "links": [{"to_site": "cloud", **WAN}],
    },
    "cloud-cpu": {
        "site": "cloud",
        "tier": "cloud",
        "cpu_slots": 2,
        "links": [{"to_site": "edge-a", **WAN}],
    },
}


# All three agents share this host: its GPUs must not be advertised three times, and the
# declared WAN links above must not be replaced by loopback measurements.
DEMO_AGENT_DEFAULTS: dict[str, object] = {
    "allowed_kinds": ["synthetic", "onnx", "python"],
    "python_allow": ["edge_agent.digits"],
    "probe_gpus": False,
    "probe_accelerators": False,
    "link_probe_every_s": 0,
    # a demo stopped half-way stops at once: its agents give running work a second, not
    # the 20 s a production agent gives (past `stop_all`'s 5 s an agent is killed, and a
    # killed agent leaves its working directory behind)
    "shutdown_grace_s": 1.0,
}


def example_path(name: str = "digits.yaml") -> Path:
    return Path(__file__).resolve().parent / "examples" / name


async def _inputs(client: Client) -> list[PipelineInput]:
    """The digits data set the package carries, stored as the pipeline input `digits`."""
    given = await asyncio.to_thread(inputs.describe, "digits", DATA_FILE)
    await inputs.put(connect.jetstream(client.nc), given, DATA_FILE)
    print(f"input digits: {DATA_FILE.name}, {given.size} B, sha256 {given.sha256[:16]}...")
    return [given]


async def _score(client: Client, st: StatusReply) -> None:
    """The cloud step's output, read back as a user would (`mars get`), for a person."""
    score = next((t for t in st.tasks if t.task_id == "score"), None)
    if score is None or score.output_key is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "score.json"
        await fetch(connect.jetstream(client.nc), find(st, "score"), str(out))
        result = json.loads(await asyncio.to_thread(out.read_text))
    print(f"\nscore, read back from the cloud step's output: {result['summary']}")
    print(confusion_table(np.array(result["confusion"], dtype=np.int64)))
    print(f"(on your own cluster: mars get {st.pipeline_id} score -o score.json)")


async def _drive(url: str, pipeline: Path, timeout: float) -> int:
    client = await Client.connect(url)
    try:
        n = await client.wait_for_agents(len(AGENTS), timeout=20.0)
        if n < len(AGENTS):
            print(f"only {n}/{len(AGENTS)} agents came up")
            return 1
        print(f"cluster: {n} agents")
        for a in (await client.agents()).agents:
            print(f"  {a.agent_id:<11} site={a.site:<7} tier={a.tier:<6} devices={a.devices}")
        spec = load_pipeline(pipeline, await _inputs(client) if pipeline == example_path() else ())
        t0 = time.monotonic()
        reply = await client.submit(spec)
        print(f"\nplan ({reply.algorithm}, predicted makespan {reply.makespan_s:.3f} s):")
        print(plan_table(reply))
        st = await client.wait(reply.pipeline_id, timeout)
        wall = time.monotonic() - t0
        print("\nactual timeline (orchestrator clock; 'ran' measured by each agent):")
        print(timeline_table(st))
        print(
            f"\npipeline {st.pipeline_id} {st.state} in {st.elapsed_s:.3f} s "
            f"(submit to done {wall:.3f} s){': ' + st.reason if st.reason else ''}"
        )
        if st.state != "succeeded":
            return 1
        await _score(client, st)
        return 0
    finally:
        await client.close()


def run_demo(pipeline: Path | None = None, timeout: float = 25.0, verbose: int = 0) -> int:
    """Everything the demo started is stopped and its files removed when it ends, however
    it is asked to stop (Ctrl-C, SIGTERM): exit code 130 then."""
    t0 = time.monotonic()
    try:
        with terminate_as_interrupt():
            rc = _demo(pipeline, timeout, verbose)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        rc = 130
    print(f"demo finished in {time.monotonic() - t0:.1f} s; all processes stopped")
    return rc


def _demo(pipeline: Path | None, timeout: float, verbose: int) -> int:
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="mars-demo-") as tmp, EmbeddedNats() as server:
        print(
            f"nats-server (embedded, JetStream) on {server.url}: open, no credentials, "
            "loopback only (one machine; `mars deploy` makes a secure multi-site setup)",
            flush=True,
        )
        log = open(Path(tmp) / "services.log", "wb")  # noqa: SIM115 - closed below
        vflags = ["-v"] * verbose
        try:
            procs.append(spawn([*vflags, "orchestrator", "--nats", server.url], log=log))
            for agent_id, cfg in AGENTS.items():
                path = Path(tmp) / f"{agent_id}.yaml"
                path.write_text(yaml.safe_dump({**DEMO_AGENT_DEFAULTS, **cfg}))
                procs.append(
                    spawn(
                        [
                            *vflags,
                            "agent",
                            "--nats",
                            server.url,
                            "--id",
                            agent_id,
                            "--config",
                            str(path),
                        ],
                        log=log,
                    )
                )
            drive = _drive(server.url, pipeline or example_path(), timeout)
            try:
                return eventloop.run(drive)
            finally:
                drive.close()  # (interrupted before it began: not left never awaited)
        finally:
            stop_all(procs)
            log.close()
            if verbose:
                with contextlib.suppress(OSError):
                    print((Path(tmp) / "services.log").read_text(errors="replace")[-4000:])
