"""Every message an agent sends names it in its subject (the server's permissions let only
that agent publish it), and receivers take only what the right agent sent: a task event
naming another agent than its payload's is dropped by the orchestrator, and an output pushed
by another agent than the producer's committed one is refused by the consumer's agent."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.core import Job
from edge_agent.executors import Output
from schemas import PipelineSpec, TaskEvent, subjects
from schemas.codec import encode
from schemas.pipeline import TaskSpec
from schemas.placement import (
    CommitCommand,
    ConsumerRef,
    DataAck,
    DataTransfer,
    InputRef,
    OfferReply,
    TaskOffer,
)
from schemas.wire import WIRE_LEVEL
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from transport.rpc import request

pytestmark = pytest.mark.integration


async def test_a_task_event_naming_another_agent_is_ignored(nats_url: str) -> None:
    """A failure of `slow`, with the right pipeline, token and agent in its payload, sent
    under b's name, or in the older form that names no agent (a never uses it): dropped
    live and from a replay of the stream alike, and the pipeline completes."""
    orch, agents = await start_cluster(
        nats_url, {"a": agent_config("s", "edge"), "b": agent_config("s", "edge")}
    )
    nc = await nats.connect(nats_url)
    try:
        spec = PipelineSpec.model_validate({"name": "named", "tasks": [
            {"id": "slow", "run": {"kind": "synthetic", "seconds": 2.0},
             "requires": {"pinned_agent": "a"}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "named-1")
        task = orch.pipelines["named-1"].tasks["slow"]
        assert task.agent_id == "a"
        forged = TaskEvent(
            event_id="forged-1", pipeline_id="named-1", task_id="slow", agent_id="a",
            incarnation=agents[0].incarnation, device_id="cpu0", token=task.token,
            state="failed", error="sent by b, as a",
        )  # fmt: skip
        under_b = subjects.task_event("named-1", "slow", "b")
        unnamed = f"{subjects.EVENTS}.task.named-1.slow"
        for subject in (under_b, unnamed):
            await nc.publish(subject, encode(forged))
        await orch.wait_for(lambda: orch.misnamed_events == 2, timeout=5.0)
        for subject in (under_b, unnamed):  # as a replay of MARS_EVENTS hands them over
            await orch.on_task_event(Msg(nc, subject, data=encode(forged)))
        assert orch.misnamed_events == 4
        done = await orch.wait_terminal("named-1", 15.0)
        assert done.state == "succeeded", done.reason
        assert done.tasks["slow"].error == ""
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


class InputsAgent(RecordingAgent):
    """A real agent that notes the size and sha256 of every input its tasks ran with."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.seen: dict[tuple[str, str], dict[str, tuple[int, str]]] = {}
        self.ran = asyncio.Condition()

    async def _run(self, job: Job) -> Output:
        self.seen[job.key] = {
            p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in job.inputs.items()
        }
        async with self.ran:
            self.ran.notify_all()
        return await super()._run(job)


def _offer(agent: InputsAgent, task: dict[str, object], **kw: Any) -> TaskOffer:
    return TaskOffer(
        pipeline_id="pushed", agent_id=agent.agent_id, incarnation=agent.incarnation,
        device_id=agent.devices[0].device_id, token=1, task=TaskSpec.model_validate(task), **kw,
    )  # fmt: skip


async def test_an_output_pushed_by_another_agent_than_its_producers_is_refused(
    nats_url: str,
) -> None:
    """Bytes for `sink`'s input `src`, pushed by "evil" under its own name, or on the older
    subject that names no sender (prod, of this level, never uses it): refused, saying why,
    and the consumer runs on what prod made."""
    syn: dict[str, object] = {"kind": "synthetic", "seconds": 0.0}
    prod, cons = (
        InputsAgent(nats_url, agent_config("s", "edge"), agent_id=aid, calibrate=False)
        for aid in ("prod", "cons")
    )
    nc = await nats.connect(nats_url)
    try:
        for a in (prod, cons):
            await a.start()

        async def place(agent: InputsAgent, offer: TaskOffer) -> None:
            assert (await request(nc, subjects.offer(agent.agent_id), offer, OfferReply)).accepted
            cmd = CommitCommand(pipeline_id="pushed", task_ids=[offer.task.id])
            await request(nc, subjects.commit(agent.agent_id), cmd, CommitCommand)

        sink = _offer(
            cons, {"id": "sink", "run": syn, "deps": ["src"]},
            inputs=[InputRef(task_id="src", agent_id="prod", wire=WIRE_LEVEL, token=1)],
        )  # fmt: skip
        await place(cons, sink)
        fake = b"not what prod made"
        forged = DataTransfer(
            pipeline_id="pushed", producer="src", consumer="sink", token=1, data=fake,
            sha256=hashlib.sha256(fake).hexdigest(),
        )  # fmt: skip
        ack = await request(nc, subjects.data_from("cons", "evil"), forged, DataAck)
        assert not ack.ok and ack.reason == (
            "output of src pushed by agent evil: this placement takes it from agent prod"
        )
        ack = await request(nc, subjects.data("cons"), forged, DataAck)
        assert not ack.ok and "without its sender's name" in ack.reason, ack.reason
        assert "src" not in cons.core.jobs[("pushed", "sink")].inputs
        assert cons.data.stats["misnamed_pushes"] == 2
        src = _offer(
            prod, {"id": "src", "run": {**syn, "output_bytes": 100}},
            consumers=[ConsumerRef(task_id="sink", agent_id="cons", wire=WIRE_LEVEL)],
        )  # fmt: skip
        await place(prod, src)
        async with asyncio.timeout(10), cons.ran:
            await cons.ran.wait_for(lambda: ("pushed", "sink") in cons.seen)
        assert cons.seen[("pushed", "sink")] == {
            "src": (100, hashlib.sha256(bytes(100)).hexdigest())
        }
        assert cons.data.stats["misnamed_pushes"] == 2
    finally:
        await nc.close()
        for a in (prod, cons):
            await a.stop()
