"""The data plane over a real nats-server: large outputs through the object store with their
sha256 checked, and retained outputs fetched again by a consumer placed later."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.core import Job
from edge_agent.dataplane import CHUNK_HEADER, STREAM_CHUNK_BYTES, object_key
from edge_agent.executors import Output
from edge_agent.service import Agent
from orchestrator.service import Orchestrator
from schemas import subjects
from schemas.codec import RemoteError, decode, decode_reply, encode
from schemas.events import TaskEvent
from schemas.pipeline import PipelineSpec, TaskSpec
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
from tests.harness import agent_config
from transport.rpc import request, settle

pytestmark = pytest.mark.integration
BIG = 3 * 1024 * 1024 + 123  # several chunks, above the inline limit


class InputsAgent(Agent):
    """A real agent that notes the sha256 of every input its tasks ran with."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.seen: dict[tuple[str, str], dict[str, tuple[int, str]]] = {}

    async def _run(self, job: Job) -> Output:
        self.seen[job.key] = {
            p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in job.inputs.items()
        }
        return await super()._run(job)


async def _agents(url: str, *ids: str, site: str = "s", **cfg: Any) -> list[InputsAgent]:
    config = agent_config(site, "edge", cpu_slots=2, **cfg)
    return [InputsAgent(url, config, agent_id=aid, calibrate=False) for aid in ids]


async def _wait(cond: asyncio.Condition, pred: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout), cond:
        await cond.wait_for(pred)


def _syn(out: int, seconds: float = 0.01) -> dict[str, object]:
    return {"kind": "synthetic", "mode": "sleep", "seconds": seconds, "output_bytes": out}


@pytest.mark.parametrize("same_site", [False, True])
async def test_large_output_crosses_the_object_store_checked_or_stays_at_its_site(
    nats_url: str, same_site: bool
) -> None:
    """To another site, an output past the inline threshold goes through the object store
    (at the hub); to an agent at the producer's own site, in chunks over core NATS, which
    never leave the site: the object store is not used at all."""
    orch = Orchestrator(nats_url)
    await orch.start()
    (prod,) = await _agents(nats_url, "prod", object_chunk_bytes=256 * 1024)
    (cons,) = await _agents(
        nats_url, "cons", site="s" if same_site else "t", object_chunk_bytes=256 * 1024
    )
    for a in (prod, cons):
        await a.start()
    try:
        assert await orch.wait_for_agents(2, 10.0) == 2
        spec = PipelineSpec.model_validate(
            {
                "name": "big",
                "tasks": [
                    {"id": "src", "run": _syn(BIG), "output_bytes": BIG,
                     "requires": {"pinned_agent": "prod"}},
                    {"id": "sink", "run": _syn(0), "deps": ["src"],
                     "requires": {"pinned_agent": "cons"}},
                ],
            }
        )  # fmt: skip
        await orch.submit_spec(spec, pipeline_id="big-1")
        run = await orch.wait_terminal("big-1", 20.0)
        assert run.state == "succeeded", run.reason
        want = (BIG, hashlib.sha256(bytes(BIG)).hexdigest())
        assert cons.seen[("big-1", "sink")] == {"src": want}
        assert cons.data.stats["rejected"] == 0 and cons.data.stats["inputs"] == 1
        if same_site:
            assert prod.data.stats["objects_put"] == 0 and prod.data.stats["streamed"] == 1
            assert cons.data.stats["objects_fetched"] == 0
            assert cons.data.stats["streams_received"] == 1
        else:
            assert prod.data.stats["objects_put"] == 1 and prod.data.stats["streamed"] == 0
            assert cons.data.stats["objects_fetched"] == 1
        # the only consumer confirmed: the producer keeps nothing any more
        await _wait(prod.data.changed, lambda: len(prod.data.store) == 0)
    finally:
        for a in (prod, cons):
            await a.stop()
        await orch.stop()


async def test_a_tampered_object_is_refused_with_a_reason(nats_url: str) -> None:
    (cons,) = await _agents(nats_url, "cons", object_chunk_bytes=256 * 1024)
    await cons.start()
    nc = await nats.connect(nats_url)
    try:
        offer = TaskOffer(
            pipeline_id="tp",
            agent_id="cons",
            incarnation=cons.incarnation,
            device_id=cons.devices[0].device_id,
            token=1,
            task=TaskSpec.model_validate({"id": "sink", "run": _syn(0), "deps": ["src"]}),
            inputs=[InputRef(task_id="src", agent_id="prod")],
        )
        assert (await request(nc, subjects.offer("cons"), offer, OfferReply)).accepted
        good = bytes(range(256)) * (BIG // 256)
        key = object_key("tp", "src", 1)
        js = nc.jetstream()
        await cons.data.objects.put(js, key, good)
        info = await (await cons.data.objects.bucket(js)).get_info(key)
        assert info.size == len(good) and info.chunks == 12  # 3 MiB in 256 KiB chunks
        await cons.data.objects.put(js, key, b"\xff" + good[1:])  # overwritten by someone
        transfer = DataTransfer(
            pipeline_id="tp",
            producer="src",
            consumer="sink",
            token=1,
            object_key=key,
            size=len(good),
            sha256=hashlib.sha256(good).hexdigest(),
        )
        ack = await request(nc, subjects.data("cons"), transfer, DataAck, timeout=10)
        assert not ack.ok and ack.reason.startswith("sha256 mismatch")
        assert "src" not in cons.core.jobs[("tp", "sink")].inputs  # the consumer saw nothing
        assert cons.data.stats["rejected"] == 1
        await cons.data.objects.put(js, key, good)  # the real bytes pass
        ack = await request(nc, subjects.data("cons"), transfer, DataAck, timeout=10)
        assert ack.ok, ack.reason
        assert len(cons.core.jobs[("tp", "sink")].inputs["src"]) == len(good)
    finally:
        await nc.close()
        await cons.stop()


async def test_a_consumer_placed_later_fetches_the_retained_output(nats_url: str) -> None:
    """The producer finished and its consumer's first agent is gone: the consumer is offered
    to another agent, which fetches the output; the producer then lets it go."""
    a, b, c = await _agents(nats_url, "node-a", "node-b", "node-c")
    for x in (a, b, c):
        await x.start()
    nc = await nats.connect(nats_url)
    finished: dict[str, asyncio.Event] = {"src": asyncio.Event(), "sink": asyncio.Event()}

    async def on_event(msg: Msg) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.state == "succeeded":
            finished[ev.task_id].set()

    await nc.subscribe(subjects.task_events_of("rp"), cb=on_event)
    pid = "rp"

    def offer(agent: Agent, task: dict[str, object], **kw: Any) -> TaskOffer:
        return TaskOffer(
            pipeline_id=pid,
            agent_id=agent.agent_id,
            incarnation=agent.incarnation,
            device_id=agent.devices[0].device_id,
            token=5,
            task=TaskSpec.model_validate(task),
            **kw,
        )

    async def place(agent: Agent, x: TaskOffer) -> None:
        assert (await request(nc, subjects.offer(agent.agent_id), x, OfferReply)).accepted
        cmd = CommitCommand(pipeline_id=pid, task_ids=[x.task.id])
        await request(nc, subjects.commit(agent.agent_id), cmd, CommitCommand)

    try:
        src = offer(
            a,
            {"id": "src", "run": _syn(5000)},
            consumers=[ConsumerRef(task_id="sink", agent_id="node-b")],
        )
        await place(a, src)  # node-b never got (or lost) the sink
        async with asyncio.timeout(10):
            await finished["src"].wait()
        await _wait(a.data.changed, lambda: a.data.store.get(pid, "src") is not None)
        retained = a.data.store.get(pid, "src")
        assert retained is not None and retained.unacked() == {"sink": "node-b"}
        sink = offer(
            c,
            {"id": "sink", "run": _syn(0), "deps": ["src"]},
            inputs=[InputRef(task_id="src", agent_id="node-a", ready=True)],
        )
        await place(c, sink)  # re-placed on node-c: it fetches from node-a
        async with asyncio.timeout(10):
            await finished["sink"].wait()
        assert c.seen[(pid, "sink")] == {"src": (5000, hashlib.sha256(bytes(5000)).hexdigest())}
        assert a.data.stats["fetches_served"] == 1 and c.data.stats["fetched"] == 1
        # node-c's receipt was the last one outstanding: node-a waits on it no more (it keeps it
        # a while as delivered, for a consumer placed again)
        await _wait(a.data.changed, lambda: (pid, "src") not in a.data.store.entries)
        assert b.data.stats["inputs"] == 0
    finally:
        await nc.close()
        for x in (a, b, c):
            await x.stop()


async def test_cancel_releases_retained_outputs(nats_url: str) -> None:
    (a,) = await _agents(nats_url, "solo")
    await a.start()
    nc = await nats.connect(nats_url)
    try:
        entry, _ = a.data.store.put("cp", "src", 1, b"x" * 10, {"sink": "elsewhere"})
        assert entry is not None
        from schemas.placement import CancelCommand

        cmd = CancelCommand(pipeline_id="cp", reason="user")
        await request(nc, subjects.cancel("solo"), cmd, CancelCommand)
        assert a.data.store.get("cp", "src") is None
        # a late receipt for a released output is harmless
        ack = DataAck(pipeline_id="cp", consumer="sink", ok=True, producer="src", token=1)
        await nc.publish(subjects.data_ack("solo"), encode(ack))
        await settle(nc)
    finally:
        await nc.close()
        await a.stop()


async def test_work_spawned_while_an_agent_stops_never_runs(nats_url: str) -> None:
    """A task's clean-up may spawn more work (a push, a spill into the state directory); once
    the agent stops, that work is cancelled before it starts, and none is left behind."""
    cpu = {"device_id": "cpu0", "kind": "cpu", "gflops": 50.0, "emulated": True}
    config = agent_config("s1", "edge", probe_cpu=False, devices=[cpu])
    agent = Agent(nats_url, config, agent_id="z", calibrate=False)
    await agent.start()
    ran: list[str] = []
    waiting = asyncio.Event()

    async def late() -> None:
        ran.append("late")

    async def long() -> None:
        try:
            waiting.set()
            await asyncio.Event().wait()
        finally:
            agent._spawn(late())

    agent._spawn(long())
    await waiting.wait()
    await agent.stop()
    assert ran == [] and all(t.done() for t in agent._tasks)


async def test_a_running_producer_sends_its_output_where_a_routing_update_says(
    nats_url: str,
) -> None:
    """The consumer moved while its producer ran: the producer is offered again under the
    same token with the new consumer's agent, and pushes its output there when it ends (it
    pushed to the old one, and the consumer waited for a sweep to fetch it)."""
    a, b, c = await _agents(nats_url, "node-a", "node-b", "node-c")
    for x in (a, b, c):
        await x.start()
    nc = await nats.connect(nats_url)
    pid = "rr"
    try:
        src = TaskOffer(
            pipeline_id=pid, agent_id="node-a", incarnation=a.incarnation,
            device_id=a.devices[0].device_id, token=5,
            task=TaskSpec.model_validate({"id": "src", "run": _syn(100, seconds=0.5)}),
            consumers=[ConsumerRef(task_id="sink", agent_id="node-b")],
        )  # fmt: skip
        sink = TaskOffer(
            pipeline_id=pid, agent_id="node-c", incarnation=c.incarnation,
            device_id=c.devices[0].device_id, token=5,
            task=TaskSpec.model_validate({"id": "sink", "run": _syn(0), "deps": ["src"]}),
            inputs=[InputRef(task_id="src", agent_id="node-a")],
        )  # fmt: skip
        for agent, offer in ((a, src), (c, sink)):
            reply = await request(nc, subjects.offer(agent.agent_id), offer, OfferReply)
            assert reply.accepted
            cmd = CommitCommand(pipeline_id=pid, task_ids=[offer.task.id])
            await request(nc, subjects.commit(agent.agent_id), cmd, CommitCommand)
        await _wait(a.data.changed, lambda: a.core.jobs.get((pid, "src")) is None
                    or a.core.jobs[(pid, "src")].state == "running")  # fmt: skip
        assert a.core.jobs[(pid, "src")].state == "running"  # 0.5 s: the update comes first
        update = src.model_copy(
            update={"consumers": [ConsumerRef(task_id="sink", agent_id="node-c")]}
        )
        assert (await request(nc, subjects.offer("node-a"), update, OfferReply)).accepted
        await _wait(c.data.changed, lambda: (pid, "sink") in c.seen)
        assert c.seen[(pid, "sink")] == {"src": (100, hashlib.sha256(bytes(100)).hexdigest())}
        assert c.data.stats["inputs"] == 1 and c.data.stats["fetched"] == 0  # pushed to it
        assert b.data.stats["inputs"] == 0 and b.data.stats["rejected"] == 0
    finally:
        await nc.close()
        for x in (a, b, c):
            await x.stop()


async def test_a_finished_task_output_is_kept_before_its_job_is_let_go(nats_url: str) -> None:
    """From the moment a finished job leaves its agent's jobs, its output is retained: a
    fetch in between found neither, answered that the output was gone, and the producer was
    run again (found in the mixed-priority stress with tasks of 20-120 ms)."""
    orch = Orchestrator(nats_url)
    await orch.start()
    (solo,) = await _agents(nats_url, "solo")
    kept_at_finish: dict[str, bool] = {}
    finish = solo.core.finish

    def noting(key: tuple[str, str], ok: bool) -> Job | None:
        kept_at_finish[key[1]] = solo.data.store.get(*key) is not None
        return finish(key, ok)

    solo.core.finish = noting  # type: ignore[method-assign]
    await solo.start()
    try:
        assert await orch.wait_for_agents(1, 10.0) == 1
        spec = PipelineSpec.model_validate({"name": "kept", "tasks": [
            {"id": "a", "run": _syn(64)},
            {"id": "b", "run": _syn(64), "deps": ["a"]},
        ]})  # fmt: skip
        await orch.submit_spec(spec, pipeline_id="kept-1")
        assert (await orch.wait_terminal("kept-1", 10.0)).state == "succeeded"
        # a's output has a consumer, b's none: only a's is kept, and kept before a goes
        assert kept_at_finish == {"a": True, "b": False}
    finally:
        await solo.stop()
        await orch.stop()


async def test_a_chunked_sending_is_checked_whole_and_a_lost_chunk_fails_it(
    nats_url: str,
) -> None:
    """The consumer's agent takes a sending's chunks only in order: one missing fails the
    sending (the producer sends it again, from the first chunk); bytes whose sha256 is not
    the one announced are refused once all came; the true bytes reach the job."""
    (cons,) = await _agents(nats_url, "cons")
    await cons.start()
    nc = await nats.connect(nats_url)
    try:
        offer = TaskOffer(
            pipeline_id="cs", agent_id="cons", incarnation=cons.incarnation,
            device_id=cons.devices[0].device_id, token=1,
            task=TaskSpec.model_validate(
                {"id": "sink", "run": _syn(0, seconds=30), "deps": ["src"]}
            ),
            inputs=[InputRef(task_id="src", agent_id="prod", wire=WIRE_LEVEL)],
        )  # fmt: skip
        assert (await request(nc, subjects.offer("cons"), offer, OfferReply)).accepted
        good = bytes(range(256)) * 4096  # 1 MiB: four chunks
        to = subjects.data_from("cons", "prod")

        async def chunk(sid: str, i: int, data: bytes) -> DataAck:
            part = data[i * STREAM_CHUNK_BYTES : (i + 1) * STREAM_CHUNK_BYTES]
            msg = await nc.request(to, part, timeout=5, headers={CHUNK_HEADER: f"{sid} {i}"})
            return decode_reply(msg.data, msg.headers, DataAck)

        async def send(sid: str, data: bytes, order: list[int]) -> DataAck:
            opening = DataTransfer(
                pipeline_id="cs", producer="src", consumer="sink", token=1, stream=sid,
                size=len(good), sha256=hashlib.sha256(good).hexdigest(),
            )  # fmt: skip
            ack = await request(nc, to, opening, DataAck)
            assert ack.ok, ack.reason
            for i in order:
                ack = await chunk(sid, i, data)
            return ack

        with pytest.raises(RemoteError, match="chunk 1 expected"):
            await send("lost", good, [0, 2])
        with pytest.raises(RemoteError, match="no sending lost from prod"):
            await chunk("lost", 3, good)  # it was dropped with the chunk that failed it
        assert not cons.data._streams
        bad = await send("bad", b"\xff" + good[1:], [0, 1, 2, 3])
        assert not bad.ok and bad.reason.startswith("sha256 mismatch"), bad.reason
        assert "src" not in cons.core.jobs[("cs", "sink")].inputs
        ok = await send("ok", good, [0, 1, 2, 3])
        assert ok.ok, ok.reason
        assert cons.core.jobs[("cs", "sink")].inputs["src"] == good
        assert cons.data.stats["streams_received"] == 2 and not cons.data._streams
    finally:
        await nc.close()
        await cons.stop()
