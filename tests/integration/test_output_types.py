"""An output whose producer's spec declares no `output_type` reaches its consumers as what its
executor made of it, over a real nats-server and real agents: a `python` task that returns a
dict feeds the next one a dict, whether the output crosses inline, through the object store,
stays on its agent, or is fetched by a consumer placed after its producer ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.config import AgentConfig
from edge_agent.service import Agent
from schemas import PipelineSpec, subjects
from schemas.codec import decode
from schemas.events import TaskEvent
from schemas.pipeline import TaskSpec
from schemas.placement import CommitCommand, ConsumerRef, InputRef, OfferReply, TaskOffer
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from transport.rpc import request

pytestmark = pytest.mark.integration

MODS = ["tests.integration.jsontasks"]
#: Outputs above this many bytes go by reference to the object store.
THRESHOLD = 1024


def _config(tier: str = "edge", site: str = "s") -> AgentConfig:
    cpu = {"device_id": "cpu0", "kind": "cpu", "gflops": 100.0, "emulated": True}
    return agent_config(
        site, tier, probe_cpu=False, devices=[cpu], cpu_slots=2,
        allowed_kinds=["synthetic", "python"], python_allow=MODS,
        object_threshold_bytes=THRESHOLD,
    )  # fmt: skip


def _py(fn: str, **kwargs: Any) -> dict[str, Any]:
    return {"kind": "python", "entry": f"tests.integration.jsontasks:{fn}", "kwargs": kwargs}


def _task(tid: str, run: dict[str, Any], on: str, deps: tuple[str, ...] = ()) -> dict[str, Any]:
    inputs = [{"name": "doc", "source": d} for d in deps]
    return {"id": tid, "run": run, "deps": list(deps), "inputs": inputs,
            "requires": {"pinned_agent": on}}  # fmt: skip


async def test_a_dict_returned_undeclared_reaches_the_next_python_task_as_a_dict(
    nats_url: str,
) -> None:
    """`small` crosses to the other agent inline, `large` (past the object threshold) through
    the object store (the other agent is at another site), and `small` also goes to a
    consumer on its own agent."""
    orch, agents = await start_cluster(nats_url, {"a": _config(), "b": _config(site="t")})
    a, b = agents
    try:
        spec = PipelineSpec.model_validate({"name": "json", "tasks": [
            _task("small", _py("make", n=3), "a"),
            _task("large", _py("make", n=4, pad=20 * THRESHOLD), "a"),
            _task("far", _py("take"), "b", ("small",)),
            _task("near", _py("take"), "a", ("small",)),
            _task("by_ref", _py("take"), "b", ("large",)),
        ]})  # fmt: skip
        await orch.submit_spec(spec, "json")
        run = await orch.wait_terminal("json", 30.0)
        assert run.state == "succeeded", (run.reason, run.placement_log)
        made = {k[1]: v for x in agents for k, v in x.made.items() if k[0] == "json"}
        assert len(made["large"]) > THRESHOLD >= len(made["small"])
        got = {t: json.loads(made[t]) for t in ("far", "near", "by_ref")}
        assert got == {
            "far": {"type": "dict", "n": 3},
            "near": {"type": "dict", "n": 3},
            "by_ref": {"type": "dict", "n": 4},
        }
        assert a.data.stats["objects_put"] == 1 and b.data.stats["objects_fetched"] == 1
    finally:
        await stop_cluster(orch, agents)


async def _wait(cond: asyncio.Condition, pred: Callable[[], bool], timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout), cond:
        await cond.wait_for(pred)


@pytest.mark.parametrize("pad", [0, 20 * THRESHOLD], ids=["inline", "by-reference"])
async def test_a_consumer_placed_after_its_producer_ended_fetches_a_dict(
    nats_url: str, pad: int
) -> None:
    """The producer ran for a consumer on node-b, which no longer holds that task; the task is
    placed on node-c, which fetches the retained output and takes it as the dict it was."""
    agents: list[RecordingAgent] = []
    for aid in ("node-a", "node-b", "node-c"):
        agents.append(RecordingAgent(nats_url, _config(), agent_id=aid, calibrate=False))
        await agents[-1].start()
    a, b, c = agents
    nc = await nats.connect(nats_url)
    finished = {t: asyncio.Event() for t in ("src", "sink")}

    async def on_event(msg: Msg) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.state == "succeeded":
            finished[ev.task_id].set()

    pid = "fj"
    await nc.subscribe(subjects.task_events_of(pid), cb=on_event)

    async def place(agent: Agent, task: dict[str, Any], **kw: Any) -> None:
        offer = TaskOffer(
            pipeline_id=pid, agent_id=agent.agent_id, incarnation=agent.incarnation,
            device_id=agent.devices[0].device_id, token=5, task=TaskSpec.model_validate(task),
            **kw,
        )  # fmt: skip
        reply = await request(nc, subjects.offer(agent.agent_id), offer, OfferReply)
        assert reply.accepted, reply
        cmd = CommitCommand(pipeline_id=pid, task_ids=[offer.task.id])
        await request(nc, subjects.commit(agent.agent_id), cmd, CommitCommand)

    try:
        await place(
            a, {"id": "src", "run": _py("make", n=5, pad=pad)},
            consumers=[ConsumerRef(task_id="sink", agent_id="node-b")],
        )  # fmt: skip
        async with asyncio.timeout(15):
            await finished["src"].wait()
        await _wait(a.data.changed, lambda: a.data.store.get(pid, "src") is not None)
        sink = {"id": "sink", "run": _py("take"), "deps": ["src"],
                "inputs": [{"name": "doc", "source": "src"}]}  # fmt: skip
        await place(c, sink, inputs=[InputRef(task_id="src", agent_id="node-a", ready=True)])
        async with asyncio.timeout(15):
            await finished["sink"].wait()
        assert json.loads(c.made[(pid, "sink")]) == {"type": "dict", "n": 5}
        assert a.data.stats["fetches_served"] >= 1 and c.data.stats["fetched"] == 1
        assert b.data.stats["inputs"] == 0
    finally:
        await nc.close()
        for x in agents:
            await x.stop()


async def test_a_declared_output_type_wins_over_what_the_executor_made(nats_url: str) -> None:
    """Declared `application/octet-stream`: the consumer is given the JSON's bytes as they
    are, not the dict the executor made them from."""
    orch, agents = await start_cluster(nats_url, {"a": _config(), "b": _config()})
    try:
        spec = PipelineSpec.model_validate({"name": "raw", "tasks": [
            {**_task("src", _py("make", n=6), "a"), "output_type": "application/octet-stream"},
            _task("sink", _py("take"), "b", ("src",)),
        ]})  # fmt: skip
        await orch.submit_spec(spec, "raw")
        run = await orch.wait_terminal("raw", 30.0)
        assert run.state == "succeeded", (run.reason, run.placement_log)
        made = {k[1]: v for x in agents for k, v in x.made.items() if k[0] == "raw"}
        assert json.loads(made["sink"]) == {"type": "bytes", "n": None}
    finally:
        await stop_cluster(orch, agents)
