"""Real data through real processes, and a producer's agent killed mid-pipeline: nats-server,
an orchestrator and `mars agent` processes on two tiers (two edge agents, one cloud agent) run
the handwritten-digits pipeline on a file given with `mars submit --input`: an exec task
unzips it, python tasks decode and scale its arrays, an onnx task runs the shipped digits
model on them and a python task scores the predictions.

`decode` waits for two producers: `unzip` (edge, quick) and `part` (cloud), which says which
part of the data to decode only once the test releases it. The agent that ran `unzip` is
SIGKILLed as soon as the orchestrator has its success, while `decode` still waits: `unzip` is
run again on the other edge agent, and every output `mars get` returns is exactly what the
same computation done here makes."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import re
import shlex
import signal
from pathlib import Path
from typing import Any

import nats
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from edge_agent import digits, values
from edge_agent.executors import BUILTIN_MODELS
from orchestrator.service import Orchestrator
from schemas import subjects
from schemas.codec import decode
from schemas.events import TaskEvent
from schemas.placement import FetchRequest
from tests.harness import AgentProcesses, mars_cli
from transport.rpc import settle

pytestmark = pytest.mark.e2e

PID = "digits-kill"
AGENT = {
    "allowed_kinds": ["exec", "python", "onnx"],
    "python_allow": ["edge_agent.digits"],
    "exec_allow": [{"path": "sh", "prefix": ["-c"], "args": [".*"]}],
}


def _gate_script(gate: Path) -> str:
    """Print the gate file once it exists (it appears whole: renamed into place); give up
    after about 30 s, so a test that fails first leaves nothing waiting for good."""
    g = shlex.quote(str(gate))
    return (
        f"i=0; until [ -e {g} ]; do i=$((i+1)); [ $i -le 1500 ] || exit 1; sleep 0.02; done; "
        f"cat {g}"
    )


def _spec(gate: Path) -> dict[str, Any]:
    edge, cloud = {"tiers": ["edge"]}, {"tiers": ["cloud"]}
    return {"name": "digits-kill", "tasks": [
        {"id": "unzip", "run": {"kind": "exec", "argv": ["sh", "-c", "gunzip -c {in:digits}"]},
         "inputs": [{"name": "digits", "pipeline_input": "digits"}], "requires": edge,
         "keep_output": True},
        {"id": "part", "run": {"kind": "exec", "argv": ["sh", "-c", _gate_script(gate)]},
         "output_type": "text/plain", "requires": cloud},
        {"id": "decode", "run": {"kind": "python", "entry": "edge_agent.digits:decode"},
         "deps": ["unzip", "part"],
         "inputs": [{"name": "data", "source": "unzip"}, {"name": "part", "source": "part"}],
         "requires": edge},
        {"id": "preprocess", "run": {"kind": "python", "entry": "edge_agent.digits:preprocess"},
         "deps": ["decode"], "inputs": [{"name": "pixels", "source": "decode", "member": "pixels"}],
         "requires": edge, "keep_output": True},
        {"id": "classify", "run": {"kind": "onnx", "model": "digits"}, "deps": ["preprocess"],
         "inputs": [{"name": "pixels", "source": "preprocess"}], "requires": cloud,
         "keep_output": True},
        {"id": "score", "run": {"kind": "python", "entry": "edge_agent.digits:aggregate"},
         "deps": ["classify", "decode"],
         "inputs": [{"name": "predicted", "source": "classify", "member": "label"},
                    {"name": "labels", "source": "decode", "member": "labels"}],
         "output_type": "application/json", "requires": cloud},
    ]}  # fmt: skip


def _release(gate: Path, text: str) -> None:
    tmp = gate.with_name(gate.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, gate)


async def _get(nats_url: str, tmp: Path, task: str) -> bytes:
    out = tmp / f"got-{task}"
    code, _, err = await mars_cli("get", PID, task, "-o", str(out), "--nats", nats_url)
    assert code == 0, err
    return out.read_bytes()


async def test_a_producer_killed_mid_pipeline_runs_again_and_the_outputs_stay_exact(
    nats_url: str, tmp_path: Path
) -> None:
    # the same computation, here
    data = tmp_path / "digits.csv.gz"
    data.write_bytes(digits.dataset_bytes())
    csv = gzip.decompress(data.read_bytes())
    test = digits.decode(csv, part="test")
    x = digits.preprocess(test["pixels"])
    sess = ort.InferenceSession(str(BUILTIN_MODELS / "digits.onnx"))
    probs, label = sess.run(["probabilities", "label"], {"pixels": x})
    score = digits.aggregate(label, test["labels"])
    gate = tmp_path / "part"
    spec = tmp_path / "digits-kill.yaml"
    spec.write_text(yaml.safe_dump(_spec(gate)))

    orch = Orchestrator(nats_url)
    await orch.start()
    nc = await nats.connect(nats_url)
    ends: list[TaskEvent] = []
    heard = asyncio.Condition()

    async def on_event(msg: Any) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.state == "succeeded":
            async with heard:
                ends.append(ev)
                heard.notify_all()

    await nc.subscribe(subjects.task_events_of(PID), cb=on_event)
    # where part's agent is told to send part's output (the orchestrator routing a moved
    # consumer; a consumer asking for itself)
    routes: list[FetchRequest] = []

    async def on_fetch(msg: Any) -> None:
        async with heard:
            routes.append(decode(msg.data, FetchRequest))
            heard.notify_all()

    await nc.subscribe(subjects.fetch("cloud"), cb=on_fetch)
    await settle(nc)
    try:
        async with AgentProcesses(nats_url, tmp_path) as fleet:
            for name, tier in (("edge-a", "edge"), ("edge-b", "edge"), ("cloud", "cloud")):
                await fleet.start(name, tier=tier, **AGENT)
            assert await orch.wait_for_agents(3, timeout=30.0) == 3
            code, _, err = await mars_cli(
                "submit", str(spec), "--id", PID, "--input", f"digits={data}", "--nats", nats_url
            )
            assert code == 0, err
            run = orch.pipelines[PID]
            unzip = run.tasks["unzip"]
            # the orchestrator has unzip's success; decode waits for part, still held here
            await orch.wait_for(lambda: unzip.state == "succeeded", 20.0)
            doomed = unzip.agent_id
            assert doomed in ("edge-a", "edge-b") and run.tasks["decode"].state != "started"
            decode_moves = run.tasks["decode"].agent_id == doomed
            fleet.procs[doomed].send_signal(signal.SIGKILL)
            # unzip's output went with its agent: it runs again, on the other edge agent
            await orch.wait_for(
                lambda: unzip.state == "succeeded" and unzip.agent_id not in (None, doomed), 20.0
            )
            if decode_moves:
                # part, still running, is told where decode went before it ends: its output
                # goes there when it does, not to the dead agent
                async with asyncio.timeout(10.0), heard:
                    await heard.wait_for(lambda: any(
                        (r.producer, r.consumer, r.agent_id)
                        == ("part", "decode", run.tasks["decode"].agent_id) for r in routes
                    ))  # fmt: skip
            _release(gate, "test")
            run = await orch.wait_terminal(PID, 20.0)
            assert run.state == "succeeded", (run.reason, run.placement_log)
            survivor = ({"edge-a", "edge-b"} - {doomed}).pop()
            assert unzip.agent_id == survivor
            for t in ("decode", "preprocess"):
                assert run.tasks[t].agent_id == survivor, (t, run.placement_log)
            log = run.placement_log
            assert any(re.search(r"dead .*re-running unzip \(outputs lost\)", x) for x in log), log
            async with asyncio.timeout(10.0), heard:  # every end, as this client hears them
                await heard.wait_for(lambda: {e.task_id for e in ends} == set(run.tasks))
            ran = {t: {(e.agent_id, e.token) for e in ends if e.task_id == t} for t in run.tasks}
            assert {a for a, _ in ran["unzip"]} == {doomed, survivor}, ran
            assert len(ran["unzip"]) == 2, ran
            assert all(len(ran[t]) == 1 for t in ran if t != "unzip"), ran  # each once

            # what a user gets back is exactly what the same computation makes here
            tasks = ("unzip", "preprocess", "classify", "score")
            got_back = await asyncio.gather(*(_get(nats_url, tmp_path, t) for t in tasks))
            out = dict(zip(tasks, got_back, strict=True))
            assert out["unzip"] == csv
            assert out["preprocess"] == values.npy(x)
            with np.load(io.BytesIO(out["classify"])) as got:
                assert sorted(got.files) == ["label", "probabilities"]
                assert np.array_equal(got["label"], label)
                assert np.allclose(got["probabilities"], probs, rtol=0.0, atol=1e-6)
            final = out["score"]
            made = json.dumps(score, separators=(",", ":"), sort_keys=True, allow_nan=False)
            assert final == made.encode()  # the python task's JSON, byte for byte
            # the model card's held-out score, read back from the cloud step's output
            assert json.loads(final)["summary"].startswith("353 of 360 digits right")
    finally:
        _release(gate, "test")  # a gate task still waiting (a failure above) ends now
        await nc.close()
        await orch.stop()
