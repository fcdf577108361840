"""Nothing of a pipeline stays past its retention: over a real nats-server, a pipeline that
takes a pipeline input, moves an output too large to go inline between two agents, runs an
exec task and keeps its last output for `mars get`; once it ended and its retention passed,
the object store buckets are empty, the agents keep none of its outputs, and no exec
working directory is left."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from console import inputs
from schemas import PipelineSpec, subjects
from tests.harness import agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration

KEEP_S = 1.0
#: Inputs are kept from when they are stored: long enough for the task that reads them.
INPUT_KEEP_S = 3.0
MODS = ["edge_agent.builtin_tasks"]
SH = [{"path": "sh", "prefix": ["-c"], "args": [".*"]}]
BUCKETS = (subjects.OUTPUTS_BUCKET, subjects.INPUTS_BUCKET, subjects.DATA_BUCKET)


async def _stored(js: Any) -> dict[str, int]:
    """Messages each bucket's stream holds (a bucket not made yet holds none)."""
    out = {}
    for b in BUCKETS:
        try:
            out[b] = (await js.stream_info(f"OBJ_{b}")).state.messages
        except nats.js.errors.NotFoundError:
            out[b] = 0
    return out


async def test_a_pipelines_data_is_gone_from_store_and_agents_once_its_retention_passed(
    nats_url: str, tmp_path: Path
) -> None:
    work = tmp_path / "exec"
    work.mkdir()
    kinds = ["python", "exec"]
    dev = [{"device_id": "cpu0", "kind": "cpu", "gflops": 100.0, "emulated": True}]
    keep = {"output_keep_s": KEEP_S, "object_ttl_s": KEEP_S, "retain_max_age_s": KEEP_S}
    configs = {
        aid: agent_config(site, tier, probe_cpu=False, devices=dev, allowed_kinds=kinds,
                          python_allow=MODS, exec_allow=SH, exec_work_dir=str(work), **keep)
        for aid, site, tier in (("edge", "s1", "edge"), ("cloud", "s2", "cloud"))
    }  # fmt: skip
    orch, agents = await start_cluster(nats_url, configs)
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        given = tmp_path / "label.txt"
        given.write_bytes(b"frames of the north gate\n")
        await inputs.bucket(js, keep_s=INPUT_KEEP_S)
        label = inputs.describe("label", given)
        assert await inputs.put(js, label, given)
        py = {"kind": "python"}
        spec = PipelineSpec.model_validate({"name": "gone", "inputs": [label.model_dump()],
            "tasks": [
                # 48 images of 3x32x32 float32: 576 KiB, past the inline threshold
                {"id": "images", "run": {**py, "entry": "edge_agent.builtin_tasks:image_batch",
                                         "kwargs": {"n": 48, "seed": 3}},
                 "requires": {"tiers": ["edge"]}},
                {"id": "scaled", "run": {**py, "entry": "edge_agent.builtin_tasks:scale",
                                         "kwargs": {"by": 2.0}}, "deps": ["images"],
                 "inputs": [{"name": "x", "source": "images"}], "requires": {"tiers": ["cloud"]}},
                {"id": "title", "run": {"kind": "exec", "argv": [
                    "sh", "-c", "tr a-z A-Z < {in:label}"]},
                 "inputs": [{"name": "label", "pipeline_input": "label"}],
                 "requires": {"tiers": ["cloud"]}},
                {"id": "tag", "run": {"kind": "exec", "argv": [
                    "sh", "-c", "wc -c < {in:x} && cat {in:title}"]}, "deps": ["scaled", "title"],
                 "inputs": [{"name": "x", "source": "scaled"},
                            {"name": "title", "source": "title"}],
                 "requires": {"tiers": ["edge"]}},
            ]})  # fmt: skip
        await orch.submit_spec(spec, "gone")
        run = await orch.wait_terminal("gone", 30.0)
        assert run.state == "succeeded", (run.reason, run.placement_log)
        made = {k[1]: v for a in agents for k, v in a.made.items() if k[0] == "gone"}
        assert made["tag"] == b"589952\nFRAMES OF THE NORTH GATE\n"  # 576 KiB .npy + label
        held = await _stored(js)
        assert held[subjects.INPUTS_BUCKET] and held[subjects.OUTPUTS_BUCKET], held
        for b in (subjects.OUTPUTS_BUCKET, subjects.DATA_BUCKET):
            cfg = (await js.stream_info(f"OBJ_{b}")).config
            assert cfg.max_age == pytest.approx(KEEP_S), (b, cfg.max_age)
        assert list(work.iterdir()) == []  # each job's directory went with the job
        # retention passes: the server drops what it holds, the agents what they keep
        deadline = time.monotonic() + 15.0
        while (left := await _stored(js)) != dict.fromkeys(BUCKETS, 0) or any(
            len(a.data.store) for a in agents
        ):
            assert time.monotonic() < deadline, (
                left, {a.agent_id: len(a.data.store) for a in agents}
            )  # fmt: skip
            await asyncio.sleep(0.2)  # an age limit passing: there is no event to await
    finally:
        await nc.close()
        await stop_cluster(orch, agents)
