"""Real work through a pipeline, over a real nats-server and real agents on two tiers: a
python task makes a batch of images, another scales it, an onnx task runs a model on the
result, and exec turns the model's output into a file; every step consumes what the one
before it produced, checked against the same computation done here."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from edge_agent import builtin_tasks, values
from edge_agent.config import AgentConfig
from edge_agent.executors import BUILTIN_MODELS
from schemas import PipelineSpec
from schemas.errors import ServiceError
from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster

pytestmark = pytest.mark.integration

MODS = ["edge_agent.builtin_tasks"]
SH = [{"path": "sh", "prefix": ["-c"], "args": [".*"]}]


def _configs() -> dict[str, AgentConfig]:
    def dev(kind: str) -> list[dict[str, object]]:
        return [{"device_id": f"{kind}0", "kind": kind, "gflops": 100.0, "emulated": True}]

    kinds = ["synthetic", "onnx", "exec", "python"]
    return {
        "edge": agent_config("s1", "edge", probe_cpu=False, devices=dev("cpu"),
                             allowed_kinds=kinds, python_allow=MODS, exec_allow=SH),
        "cloud": agent_config("s2", "cloud", probe_cpu=False, devices=dev("cpu"),
                              allowed_kinds=kinds, python_allow=MODS, exec_allow=SH),
    }  # fmt: skip


def _pipeline() -> PipelineSpec:
    py = {"kind": "python"}
    return PipelineSpec.model_validate({"name": "io", "tasks": [
        {"id": "images", "run": {**py, "entry": "edge_agent.builtin_tasks:image_batch",
                                 "kwargs": {"n": 3, "seed": 7}},
         "requires": {"tiers": ["edge"]}},
        {"id": "scaled", "run": {**py, "entry": "edge_agent.builtin_tasks:scale",
                                 "kwargs": {"by": 255.0}}, "deps": ["images"],
         "inputs": [{"name": "x", "source": "images"}], "requires": {"tiers": ["edge"]}},
        {"id": "infer", "run": {"kind": "onnx", "model": "tiny_cnn"}, "deps": ["scaled"],
         "inputs": [{"name": "x", "source": "scaled"}], "requires": {"tiers": ["cloud"]},
         "keep_output": True},
        {"id": "report", "run": {"kind": "exec", "argv": [
            "sh", "-c", "cp {in:probs} {out}/probs.npy && wc -c < {in:probs}"],
            "output": "probs.npy"}, "deps": ["infer"],
         "inputs": [{"name": "probs", "source": "infer"}], "requires": {"tiers": ["edge"]}},
    ]})  # fmt: skip


async def test_each_task_computes_on_what_the_one_before_it_made(
    nats_url: str, tmp_path: Path
) -> None:
    orch, agents = await start_cluster(nats_url, _configs())
    try:
        await orch.submit_spec(_pipeline(), "io")
        run = await orch.wait_terminal("io", 30.0)
        assert run.state == "succeeded", (run.reason, run.placement_log)
        assert {run.tasks[t].agent_id for t in ("images", "scaled", "report")} == {"edge"}
        assert run.tasks["infer"].agent_id == "cloud"  # the tensor crossed between tiers
        made = {k[1]: v for a in agents for k, v in a.made.items() if k[0] == "io"}
        # the same computation, here
        x = builtin_tasks.scale(builtin_tasks.image_batch(n=3, seed=7), by=255.0)
        assert np.array_equal(values.decode(made["scaled"]), x)
        sess = ort.InferenceSession(str(BUILTIN_MODELS / "tiny_cnn.onnx"))
        (probs,) = sess.run(None, {"x": x})
        assert np.allclose(values.decode(made["infer"]), probs, atol=1e-6)
        assert made["report"] == made["infer"]  # the file exec wrote is its output
        # and a user gets back, exactly, with `mars get`, the output of a sink and of a task
        # whose spec asks for it; other intermediate outputs stay where they were made
        st = await orch.status_of("io")
        kept = {t.task_id for t in st.tasks if t.output_key is not None}
        assert kept == {"infer", "report"}, kept
        infer = next(t for t in st.tasks if t.task_id == "infer")
        assert (
            infer.output_type == values.NPY
            and infer.output_key == f"io/infer/{run.tasks['infer'].token}"
        )
        assert infer.output_sha256 == hashlib.sha256(made["infer"]).hexdigest()
        code, shown, _ = await mars_cli("status", "io", "--nats", nats_url)
        line = rf"infer\s+{len(made['infer'])} B\s+application/x-npy\s+sha256 {infer.output_sha256}"
        assert code == 0 and re.search(line, shown), shown
        out = tmp_path / "probs.npy"
        code, _, err = await mars_cli("get", "io", "infer", "-o", str(out), "--nats", nats_url)
        assert code == 0, err
        assert out.read_bytes() == made["infer"]
        assert np.allclose(np.load(out), probs, atol=1e-6)
        code, _, err = await mars_cli("get", "io", "nope", "-o", str(out), "--nats", nats_url)
        assert code == 1 and "has no task nope" in err
    finally:
        await stop_cluster(orch, agents)


async def test_a_pipeline_input_given_at_submit_is_what_its_task_reads(
    nats_url: str, tmp_path: Path
) -> None:
    """`mars submit --input NAME=PATH` stores the file by its digest; an exec task takes it as
    a file, and `mars get` returns exactly what it made of it. A submission naming an input
    the store does not hold is refused, saying so."""
    orch, agents = await start_cluster(nats_url, _configs())
    try:
        words = tmp_path / "words.txt"
        words.write_bytes(b"edge to cloud, real data\n")
        spec = tmp_path / "upper.yaml"
        spec.write_text(yaml.safe_dump({"name": "upper", "tasks": [
            {"id": "up", "run": {"kind": "exec", "argv": ["sh", "-c", "tr a-z A-Z < {in:text}"]},
             "inputs": [{"name": "text", "pipeline_input": "words"}]},
        ]}))  # fmt: skip
        code, _, err = await mars_cli(
            "submit", str(spec), "--id", "up1", "--input", f"words={words}", "--wait",
            "--nats", nats_url,
        )  # fmt: skip
        assert code == 0, err
        assert f"input words: {words.stat().st_size} B sha256" in err
        got = tmp_path / "up.out"
        code, _, err = await mars_cli("get", "up1", "up", "-o", str(got), "--nats", nats_url)
        assert code == 0, err
        assert got.read_bytes() == b"EDGE TO CLOUD, REAL DATA\n"
        # the same file again: stored before, not sent twice
        code, _, err = await mars_cli(
            "submit", str(spec), "--id", "up2", "--input", f"words={words}", "--nats", nats_url
        )
        assert code == 0 and "(stored before)" in err, err
        # an input named by a digest nobody stored
        absent = PipelineSpec.model_validate({
            "name": "absent",
            "inputs": [{"name": "words", "sha256": "0" * 64, "size": 3}],
            "tasks": [{"id": "up", "run": {"kind": "exec", "argv": ["sh", "-c", "cat {in:t}"]},
                       "inputs": [{"name": "t", "pipeline_input": "words"}]}],
        })  # fmt: skip
        with pytest.raises(ServiceError) as refused:
            await orch.submit_spec(absent, "absent")
        assert refused.value.code == "not_found" and "absent" not in orch.pipelines
        assert refused.value.message == (
            "input words not in MARS_INPUTS: store it first (`mars submit --input NAME=PATH` does)"
        )
        # stored, but not what the spec says of it
        wrong = absent.model_copy(update={"inputs": [
            absent.inputs[0].model_copy(update={"sha256": hashlib.sha256(
                words.read_bytes()).hexdigest()})]})  # fmt: skip
        with pytest.raises(ServiceError) as refused:
            await orch.submit_spec(wrong, "wrong")
        assert refused.value.message == "input words is 25 B in MARS_INPUTS, the spec says 3 B"
    finally:
        await stop_cluster(orch, agents)
