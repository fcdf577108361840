"""Objects in `MARS_DATA` over a real nats-server: written and read in the object store's
own format (nats-py's reader takes ours and ours takes nats-py's), an output put once for all
its consumers, and an input not asked for again while its object is being read."""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Mapping
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import ObjectMeta, ObjectMetaOptions

from edge_agent.config import AgentConfig
from edge_agent.core import Job
from edge_agent.dataplane import object_key
from edge_agent.executors import Output
from edge_agent.objectstore import STREAM, Objects, object_digest
from edge_agent.service import Agent
from schemas import subjects
from schemas.errors import ServiceError
from schemas.pipeline import TaskSpec
from schemas.placement import (
    CommitCommand,
    ConsumerRef,
    DataAck,
    DataTransfer,
    FetchRequest,
    InputRef,
    OfferReply,
    TaskOffer,
)
from tests.harness import agent_config
from transport.rpc import request, respond, settle

pytestmark = pytest.mark.integration
CHUNK = 64 * 1024


def _bytes(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def _objects() -> Objects:
    return Objects(AgentConfig.model_validate({"probe_cpu": False, "object_chunk_bytes": CHUNK}))


async def test_objects_cross_in_the_object_store_format(nats_url: str) -> None:
    objects = _objects()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        bucket = await objects.bucket(js)
        for n, size in enumerate([0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 20 * CHUNK + 123]):
            data = _bytes(size, n)
            await objects.put(js, f"p/ours/{n}", data)
            assert await objects.read(js, f"p/ours/{n}") == (data, hashlib.sha256(data).hexdigest())
            theirs = await bucket.get(f"p/ours/{n}")  # nats-py's reader checks the digest too
            assert theirs.data == data and theirs.info.chunks == -(-size // CHUNK)
            opts = ObjectMetaOptions(max_chunk_size=CHUNK)
            await bucket.put(f"p/theirs/{n}", data, meta=ObjectMeta(options=opts))
            assert await objects.get(js, f"p/theirs/{n}") == data
    finally:
        await nc.close()


async def test_a_digest_given_is_the_one_stored(nats_url: str) -> None:
    """The producer hashed its output when it kept it: the object takes that digest rather
    than a second pass over the bytes."""
    objects = _objects()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        data = _bytes(3 * CHUNK)
        sha = hashlib.sha256(data).hexdigest()
        await objects.put(js, "p/t/1", data, sha)
        info = await (await objects.bucket(js)).get_info("p/t/1")
        assert info.digest == object_digest(sha) and info.size == len(data)
    finally:
        await nc.close()


async def test_an_object_put_again_keeps_only_its_new_chunks(nats_url: str) -> None:
    objects = _objects()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await objects.put(js, "p/t/1", _bytes(5 * CHUNK, 1))
        new = _bytes(2 * CHUNK + 1, 2)
        await objects.put(js, "p/t/1", new)
        assert await objects.get(js, "p/t/1") == new
        state = (await js.stream_info(STREAM)).state
        assert state.messages == 3 + 1  # its chunks and its description
    finally:
        await nc.close()


class SeenAgent(Agent):
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


def _syn(out: int) -> dict[str, object]:
    return {"kind": "synthetic", "mode": "sleep", "seconds": 0.0, "output_bytes": out}


def _offer(agent: Agent, pid: str, task: Mapping[str, object], **kw: Any) -> TaskOffer:
    return TaskOffer(
        pipeline_id=pid, agent_id=agent.agent_id, incarnation=agent.incarnation,
        device_id=agent.devices[0].device_id, token=1, task=TaskSpec.model_validate(task), **kw,
    )  # fmt: skip


async def _place(nc: NATS, agent: Agent, offer: TaskOffer) -> None:
    assert (await request(nc, subjects.offer(agent.agent_id), offer, OfferReply)).accepted
    cmd = CommitCommand(pipeline_id=offer.pipeline_id, task_ids=[offer.task.id])
    await request(nc, subjects.commit(agent.agent_id), cmd, CommitCommand)


async def test_an_output_for_two_agents_is_put_once_from_memory(nats_url: str) -> None:
    """Both consumers are sent the output at once: one object serves them both (each push
    used to put its own, the second replacing the first under the other's reader). The
    producer keeps no output in memory (`retain_memory_bytes: 0`): the put takes the bytes
    the task returned, and the spilled copy is what is kept."""
    size = 3 * 1024 * 1024 + 123
    cfg = {"object_chunk_bytes": 256 * 1024, "cpu_slots": 1}
    prod = SeenAgent(nats_url, agent_config("s", "edge", retain_memory_bytes=0, **cfg),
                     agent_id="prod", calibrate=False)  # fmt: skip
    cons = [
        SeenAgent(nats_url, agent_config("s", "edge", **cfg), agent_id=f"c{i}", calibrate=False)
        for i in (1, 2)
    ]
    for a in (prod, *cons):
        await a.start()
    nc = await nats.connect(nats_url)
    pid = "two"
    try:
        for i, c in enumerate(cons, 1):
            sink = {"id": f"sink{i}", "run": _syn(0), "deps": ["src"]}
            inputs = [InputRef(task_id="src", agent_id="prod")]
            await _place(nc, c, _offer(c, pid, sink, inputs=inputs))
        to = [ConsumerRef(task_id=f"sink{i}", agent_id=f"c{i}") for i in (1, 2)]
        await _place(nc, prod, _offer(prod, pid, {"id": "src", "run": _syn(size)}, consumers=to))
        want = {"src": (size, hashlib.sha256(bytes(size)).hexdigest())}
        for i, c in enumerate(cons, 1):
            key = (pid, f"sink{i}")
            async with asyncio.timeout(20), c.ran:
                await c.ran.wait_for(lambda c=c, key=key: key in c.seen)  # type: ignore[misc]
            assert c.seen[(pid, f"sink{i}")] == want
            assert c.data.stats["objects_fetched"] == 1
        assert prod.data.stats["objects_put"] == 1
        store = prod.data.store
        # put while it was hashed, and known as the kept output's copy (it goes with it)
        kept = store.get(pid, "src")
        assert kept is not None and kept.object_key == object_key(pid, "src", 1)

        def spilled() -> bool:
            kept = store.get(pid, "src")
            return kept is not None and kept.path is not None and kept.data is None

        async with asyncio.timeout(10), prod.data.changed:  # once its sending is over
            await prod.data.changed.wait_for(spilled)
        assert (pid, "src") not in store.entries  # delivered to both, kept a while on disk
        assert store.memory == 0
    finally:
        await nc.close()
        for a in (prod, *cons):
            await a.stop()


async def test_an_input_being_read_is_not_asked_for_again(nats_url: str) -> None:
    """A large object takes a while to read; a sweep (or a re-offer) meanwhile used to ask
    its producer for the input again, and the consumer read the whole object a second time.
    Another input that is missing is still asked for."""
    cons = SeenAgent(nats_url, agent_config("s", "edge", cpu_slots=2), agent_id="cons",
                     calibrate=False)  # fmt: skip
    await cons.start()
    nc = await nats.connect(nats_url)
    asked: list[tuple[str, str]] = []
    got_ask = asyncio.Event()

    async def on_fetch(msg: Msg) -> None:
        async def refuse(req: FetchRequest) -> DataTransfer:
            asked.append((req.pipeline_id, req.consumer))
            got_ask.set()
            raise ServiceError("unavailable", "not yet")

        await respond(nc, msg, FetchRequest, refuse)

    await nc.subscribe(subjects.fetch("prod"), cb=on_fetch)
    reading, release = asyncio.Event(), asyncio.Event()
    read = cons.data.objects.read

    async def slow_read(js: Any, key: str) -> tuple[bytes, str]:
        reading.set()
        await release.wait()
        return await read(js, key)

    cons.data.objects.read = slow_read  # type: ignore[method-assign]
    try:
        for pid in ("p1", "p2"):
            sink = {"id": "sink", "run": _syn(0), "deps": ["src"]}
            inputs = [InputRef(task_id="src", agent_id="prod")]
            await _place(nc, cons, _offer(cons, pid, sink, inputs=inputs))
        data = _bytes(2 * 1024 * 1024)
        key = object_key("p1", "src", 1)
        await cons.data.objects.put(nc.jetstream(), key, data)
        transfer = DataTransfer(
            pipeline_id="p1", producer="src", consumer="sink", token=1, object_key=key,
            size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        )  # fmt: skip
        sent = asyncio.create_task(
            request(nc, subjects.data("cons"), transfer, DataAck, timeout=20)
        )
        async with asyncio.timeout(10):
            await reading.wait()
        cons.data.fetch_missing(list(cons.core.jobs.values()), force=True)
        async with asyncio.timeout(10):
            await got_ask.wait()
        assert cons.nc is not None
        await settle(cons.nc)  # whatever it asked for has reached the server
        await settle(nc)  # and us
        assert asked == [("p2", "sink")]
        release.set()
        assert (await sent).ok
        assert cons.data.stats["objects_fetched"] == 1
    finally:
        release.set()
        await nc.close()
        await cons.stop()
