"""The data plane: a task's output goes straight to its consumers' agents, never via the cloud.

Small outputs travel inline in a `DataTransfer`; larger ones are put once into the JetStream
object store (chunked) and the transfer carries a reference, or, for a consumer at the
producer's site, are sent straight to its agent in chunks over core NATS (`stream`): between
two clients of one leaf-node server those never cross the leaf connection, and the object
store lives at the hub. Whichever way, the receiver checks the sha256 before the consumer sees
a byte, and takes an output pushed to it only from the agent its offer names as the producer's
(the subject names the sender: `subjects.data_from`). The producer's agent keeps every output (see
`retention`) until each consumer acknowledged it, so a consumer placed again later can `fetch`
it; a consumer that asks before the output exists is sent it when it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import math
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from edge_agent.config import AgentConfig
from edge_agent.core import AgentCore, Job
from edge_agent.objectstore import Objects
from edge_agent.retention import OutputStore, Retained
from schemas import subjects
from schemas.codec import DecodeError, RemoteError, decode_reply, encode, error_reply, headers_for
from schemas.errors import ServiceError
from schemas.pipeline import MediaType
from schemas.placement import (
    ConsumerRef,
    DataAck,
    DataTransfer,
    FetchRequest,
    InputGone,
    InputRef,
    TaskOffer,
)
from schemas.wire import SENDER_SUBJECTS
from transport import connect
from transport.rpc import request

log = logging.getLogger("mars.agent.data")
#: Seconds between retention sweeps (expiry, retries of pushes and fetches).
SWEEP_S = 5.0
#: Assumed worst-case throughput when sizing a transfer's timeout.
MIN_BYTES_PER_S = 4 << 20
#: The wire level assumed of a consumer's agent not heard of: the last one before transfers
#: carried their media type (a level-3 agent refuses a transfer with a field it does not
#: know; without it, a newer one goes by the bytes as before).
UNKNOWN_LEVEL = 3
#: Consumer agents whose wire level and site are remembered (the latest heard of).
LEVELS_KEPT = 4096
#: The header of a chunk of a chunked sending: `<stream> <index>`.
CHUNK_HEADER = "Mars-Chunk"
#: Bytes per chunk of a sending at the site: well under any server's message limit.
STREAM_CHUNK_BYTES = 256 << 10
#: Chunks of one sending that may wait for the consumer's answer at once.
STREAM_WINDOW = 8
#: Longest wait for the answer to a chunk (or to a sending's opening).
STREAM_CHUNK_TIMEOUT_S = 5.0
#: A sending whose next chunk has not come for this long is dropped (its producer retries).
STREAM_IDLE_S = 15.0
#: Bytes a consumer's agent assembles at once, over all sendings to it; an opening past it
#: is answered `unavailable` (the producer tries again later).
STREAMING_MAX_BYTES = 512 << 20
Spawn = Callable[[Coroutine[Any, Any, None]], "asyncio.Task[None]"]


def object_key(pipeline_id: str, producer: str, token: int) -> str:
    """One object per (pipeline, producer, placement): a re-run never reads an old output."""
    return f"{pipeline_id}/{producer}/{token}"


def check_payload(
    data: bytes, sha256: str, size: int | None = None, digest: str | None = None
) -> str | None:
    """Why `data` is not the payload the producer announced, or None when it is (`digest`:
    the sha256 of `data`, when it was computed as it arrived)."""
    if size is not None and len(data) != size:
        return f"size mismatch: got {len(data)} B, announced {size} B"
    got = digest or hashlib.sha256(data).hexdigest()
    if got != sha256:
        return f"sha256 mismatch: got {got[:16]}..., announced {sha256[:16]}..."
    return None


def _backoff(
    table: dict[tuple[str, str, str], tuple[float, float]], key: tuple[str, str, str]
) -> None:
    """Push the next retry of `key` out, doubling the interval up to a minute."""
    _, interval = table.get(key, (0.0, SWEEP_S / 2))
    interval = min(interval * 2, 60.0)
    table[key] = (time.monotonic() + interval, interval)


def transfer_timeout(nbytes: int) -> float:
    return 2.0 + nbytes / MIN_BYTES_PER_S


def producer_problem(inp: InputRef | None, sender: str | None) -> str | None:
    """Why an output pushed by `sender` (the agent its subject names; None: the older subject,
    which names none) is not one this placement takes, or None when it is. A push comes only
    from the agent the orchestrator committed as the producer's (`InputRef.agent_id`), which
    names itself in the subject (the server lets no other agent publish that subject); only a
    producer's agent older than `SENDER_SUBJECTS` pushes without its name."""
    if inp is None:
        return None  # not an input at all: refused as such by the core
    if sender is None:
        if inp.wire >= SENDER_SUBJECTS:
            return (
                f"output of {inp.task_id} pushed without its sender's name: its agent "
                f"{inp.agent_id} names itself"
            )
        return None
    if sender != inp.agent_id:
        return (
            f"output of {inp.task_id} pushed by agent {sender}: this placement takes it from "
            f"agent {inp.agent_id}"
        )
    return None


class Assembly:
    """One chunked sending being received: its opening transfer, the bytes so far, their
    running sha256, the next chunk's index and when the last one came."""

    def __init__(self, transfer: DataTransfer, sender: str) -> None:
        self.transfer = transfer
        self.sender = sender
        self.size = transfer.size or 0
        self.buf = bytearray(self.size)
        self.got = 0
        self.next = 0
        self.digest = hashlib.sha256()
        self.at = time.monotonic()


class DataPlane:
    def __init__(
        self,
        agent_id: str,
        core: AgentCore,
        config: AgentConfig,
        spill_dir: Path,
        *,
        on_input: Callable[[], None],
        spawn: Spawn,
    ) -> None:
        self.agent_id = agent_id
        self.core = core
        self.config = config
        self.store = OutputStore(
            spill_dir,
            memory_bytes=config.retain_memory_bytes,
            max_bytes=config.retain_max_bytes,
            max_age_s=config.retain_max_age_s,
        )
        self.objects = Objects(config)
        self.on_input = on_input
        self.spawn = spawn
        self.nc: NATS | None = None
        self.js: Any = None
        #: Notified whenever retention or inputs change (tests wait on it).
        self.changed = asyncio.Condition()
        self.stats: Counter[str] = Counter()
        # consumers that asked for an output before it existed: (pipeline, producer) -> routes
        self._routes: dict[tuple[str, str], dict[str, str]] = {}
        # (pipeline, producer, consumer) whose agent refused a push: it must fetch instead
        self._refused: set[tuple[str, str, str]] = set()
        self._pushing: set[tuple[str, str, str]] = set()
        self._fetching: set[tuple[str, str, str]] = set()
        # inputs whose object is being read (`accept`): not asked for again meanwhile
        self._receiving: set[tuple[str, str, str]] = set()
        # object key -> the put of that object under way
        self._puts: dict[str, asyncio.Task[None]] = {}
        # retry backoff per (pipeline, producer, consumer): (next attempt, interval)
        self._next_fetch: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._next_push: dict[tuple[str, str, str], tuple[float, float]] = {}
        # consumer agent -> the wire level it reads, from offers' consumers and fetches
        self._levels: OrderedDict[str, int] = OrderedDict()
        # consumer agent -> its site, from offers' consumers
        self._sites: OrderedDict[str, str] = OrderedDict()
        # chunked sendings being received: (sender agent, stream) -> what came so far
        self._streams: dict[tuple[str, str], Assembly] = {}

    def attach(self, nc: NATS) -> None:
        self.nc = nc
        self.js = connect.jetstream(nc)

    @property
    def online(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- producer side --------------------------------------------------------------------------
    def note_level(self, agent_id: str, level: int) -> None:
        """`agent_id` reads wire level `level` (0: not known, noted nothing)."""
        if level <= 0:
            return
        self._levels[agent_id] = level
        self._levels.move_to_end(agent_id)
        while len(self._levels) > LEVELS_KEPT:
            self._levels.popitem(last=False)

    def note_levels(self, consumers: list[ConsumerRef]) -> None:
        for c in consumers:
            self.note_level(c.agent_id, c.wire)
            if c.site is not None:
                self._sites[c.agent_id] = c.site
                self._sites.move_to_end(c.agent_id)
                while len(self._sites) > LEVELS_KEPT:
                    self._sites.popitem(last=False)

    def at_site(self, agent_id: str) -> bool:
        """Whether a consumer's agent is at this agent's site (as an offer said) and reads
        chunked sendings: a large output goes to it in chunks, not by the object store."""
        return (
            self._sites.get(agent_id) == self.config.site
            and self.level_of(agent_id) >= SENDER_SUBJECTS
        )

    def _data_subject(self, agent_id: str) -> str:
        """Where `agent_id` takes what this agent pushes: the subject naming this agent as
        the sender, or, for an agent older than that, the one naming none."""
        if self.level_of(agent_id) >= SENDER_SUBJECTS:
            return subjects.data_from(agent_id, self.agent_id)
        return subjects.data(agent_id)

    def level_of(self, agent_id: str) -> int:
        """The wire level a consumer's agent reads, as last heard (UNKNOWN_LEVEL: not)."""
        return self._levels.get(agent_id, UNKNOWN_LEVEL)

    def keep(
        self,
        offer: TaskOffer,
        data: bytes,
        media_type: MediaType | None = None,
        sha256: str | None = None,
    ) -> Retained | None:
        """Retain a finished task's output (`media_type`: what its executor made it as),
        before its job is let go: a fetch that finds neither the job nor its output says the
        output is gone, and its producer is run again (found when the output was kept only
        once its sending began)."""
        self.note_levels(offer.consumers)
        consumers = {c.task_id: c.agent_id for c in offer.consumers}
        consumers.update(self._routes.pop((offer.pipeline_id, offer.task.id), {}))
        entry, dropped = self.store.put(
            offer.pipeline_id,
            offer.task.id,
            offer.token,
            data,
            consumers,
            spill=not self.online,
            # sent from these bytes: a large output goes to disk once its sending ended
            # (`send_kept`), not before (the put read it back from there)
            hold=self.online,
            media_type=media_type,
            sha256=sha256,
        )
        self._forget(dropped)
        return entry

    async def send_kept(self, entry: Retained | None) -> None:
        """Send a kept output (`keep`) to each consumer."""
        try:
            if entry is not None:
                await self.push_all(entry)
        finally:
            self.store.fit_memory()
        await self._notify()

    def _key(self, entry: Retained) -> str:
        return object_key(entry.pipeline_id, entry.producer, entry.token)

    async def push_all(self, entry: Retained) -> None:
        todo = [
            (c, a)
            for c, a in entry.unacked().items()
            if (entry.pipeline_id, entry.producer, c) not in self._refused
        ]
        await asyncio.gather(*(self._push(entry, c, a) for c, a in todo))

    async def _push(self, entry: Retained, consumer: str, agent_id: str) -> None:
        flight = (entry.pipeline_id, entry.producer, consumer)
        if flight in self._pushing:
            return
        self._pushing.add(flight)
        try:
            if self.store.entries.get(entry.key) is not entry:
                return  # not retained any more: acked by all, replaced by a re-run, dropped
            ack: DataAck | None
            if agent_id == self.agent_id:
                ack = self._deliver(self._reference(entry, consumer), self.store.read(entry))
            else:
                if not self.online:
                    return  # pushed again on reconnect
                if entry.size > self.config.object_threshold_bytes and self.at_site(agent_id):
                    ack = await self._stream(entry, consumer, agent_id)
                else:
                    transfer = await self._transfer(entry, consumer)
                    ack = await self._send(agent_id, transfer)
                if ack is None:
                    _backoff(self._next_push, flight)  # unreachable: the sweep retries
                    return
            self._next_push.pop(flight, None)
            if ack.ok:
                self._acked(entry, consumer)
            else:
                log.info(
                    "%s refused %s/%s -> %s: %s",
                    agent_id,
                    entry.pipeline_id,
                    entry.producer,
                    consumer,
                    ack.reason,
                )
                self._refused.add(flight)
        except Exception as exc:
            log.warning(
                "shipping %s/%s -> %s failed: %r", *flight[:2], consumer, exc, exc_info=True
            )
        finally:
            self._pushing.discard(flight)

    def _reference(self, entry: Retained, consumer: str) -> DataTransfer:
        return DataTransfer(
            pipeline_id=entry.pipeline_id,
            producer=entry.producer,
            consumer=consumer,
            token=entry.token,
            sha256=entry.sha256,
            object_key=entry.object_key
            or object_key(entry.pipeline_id, entry.producer, entry.token),
            size=entry.size,
            media_type=entry.media_type,
        )

    async def _transfer(self, entry: Retained, consumer: str) -> DataTransfer:
        """Inline up to the threshold; else a reference to the object, put there once."""
        if entry.size <= self.config.object_threshold_bytes:
            return DataTransfer(
                pipeline_id=entry.pipeline_id,
                producer=entry.producer,
                consumer=consumer,
                token=entry.token,
                data=self.store.read(entry),
                sha256=entry.sha256,
                media_type=entry.media_type,
            )
        if entry.object_key is None:
            # once, however many consumers are sent it at the same time
            key = self._key(entry)
            put = self._puts.get(key)
            if put is None:
                put = self._puts[key] = self.spawn(self._put(entry, key))
                put.add_done_callback(functools.partial(self._put_done, key))
            await asyncio.shield(put)  # one sender stopped does not stop it for the others
        return self._reference(entry, consumer)

    def _put_done(self, key: str, put: asyncio.Task[None]) -> None:
        self._puts.pop(key, None)
        if not put.cancelled():
            put.exception()  # seen by whoever waited; none may be left to see it

    async def _put(self, entry: Retained, key: str) -> None:
        await self.objects.put(self.js, key, self.store.read(entry), entry.sha256)
        self.store.set_object(entry, key)
        self.stats["objects_put"] += 1

    def preput(
        self, offer: TaskOffer, data: bytes, digest: Awaitable[str]
    ) -> asyncio.Task[None] | None:
        """Start putting an output that will cross by object while its digest is computed
        (the digest is needed only for the object's closing entry): the hash and the put
        overlap. None when it will not cross by object (small, offline, all its consumers
        here or at this site); else the put, for `adopt` once the output is kept."""
        self.note_levels(offer.consumers)
        if (
            len(data) <= self.config.object_threshold_bytes
            or not self.online
            or self.js is None
            or all(c.agent_id == self.agent_id or self.at_site(c.agent_id) for c in offer.consumers)
        ):
            return None
        key = object_key(offer.pipeline_id, offer.task.id, offer.token)
        if key in self._puts:
            return None

        async def put() -> None:
            await self.objects.put(self.js, key, data, digest)
            self.stats["objects_put"] += 1

        task = self._puts[key] = self.spawn(put())
        task.add_done_callback(functools.partial(self._put_done, key))
        return task

    def adopt(self, entry: Retained | None, put: asyncio.Task[None]) -> None:
        """The retained output of a `preput`: the object is its copy once stored (and goes
        when it does); an output not kept has its put stopped."""
        if entry is None:
            put.cancel()
            return
        key = self._key(entry)

        def stored(t: asyncio.Task[None]) -> None:
            if (
                not t.cancelled()
                and t.exception() is None
                and self.store.get(entry.pipeline_id, entry.producer) is entry
            ):
                self.store.set_object(entry, key)

        if put.done():
            stored(put)  # a put that failed is begun again by the first send (`_transfer`)
        else:
            put.add_done_callback(stored)

    async def _send(self, agent_id: str, transfer: DataTransfer) -> DataAck | None:
        """The consumer's answer, or None when it could not be reached."""
        assert self.nc is not None
        delay = 0.05
        for _ in range(3):
            if not self.online:
                return None
            try:
                return await request(
                    self.nc,
                    self._data_subject(agent_id),
                    transfer,
                    DataAck,
                    timeout=transfer_timeout(transfer.nbytes),
                    # written for the level it reads: an older one refuses a transfer with
                    # a field it does not know (its media type), whole
                    level=self.level_of(agent_id),
                )
            except (TimeoutError, RemoteError, nats.errors.Error) as exc:
                log.debug("send to %s failed: %s", agent_id, exc)
            await asyncio.sleep(delay)  # back off before retrying a transfer
            delay *= 4
        return None

    async def _stream(self, entry: Retained, consumer: str, agent_id: str) -> DataAck | None:
        """Send an output to a consumer's agent at this site in `STREAM_CHUNK_BYTES` chunks
        over core NATS, up to `STREAM_WINDOW` of them unanswered: the consumer's answer to
        the last one (it checked the whole), its refusal of the opening, or None when the
        sending failed (unreachable, a chunk lost or refused, a timeout): the sweep tries
        again, from the first chunk."""
        assert self.nc is not None
        nc = self.nc
        subject = subjects.data_from(agent_id, self.agent_id)
        sid = secrets.token_hex(8)
        opening = DataTransfer(
            pipeline_id=entry.pipeline_id, producer=entry.producer, consumer=consumer,
            token=entry.token, sha256=entry.sha256, size=entry.size, stream=sid,
            media_type=entry.media_type,
        )  # fmt: skip
        try:
            ack = await request(
                nc, subject, opening, DataAck, timeout=STREAM_CHUNK_TIMEOUT_S,
                level=self.level_of(agent_id),
            )  # fmt: skip
        except (TimeoutError, RemoteError, nats.errors.Error) as exc:
            log.debug("opening a sending to %s failed: %s", agent_id, exc)
            return None
        if not ack.ok:
            return ack  # refused (no such job, another run): it fetches instead
        data = self.store.read(entry)
        count = max(1, math.ceil(entry.size / STREAM_CHUNK_BYTES))
        window = asyncio.Semaphore(STREAM_WINDOW)
        failed = asyncio.Event()

        async def chunk(i: int) -> DataAck | None:
            try:
                part = data[i * STREAM_CHUNK_BYTES : (i + 1) * STREAM_CHUNK_BYTES]
                msg = await nc.request(
                    subject, part, timeout=STREAM_CHUNK_TIMEOUT_S,
                    headers={CHUNK_HEADER: f"{sid} {i}"},
                )  # fmt: skip
                got = decode_reply(msg.data, msg.headers, DataAck)
            except (TimeoutError, RemoteError, DecodeError, nats.errors.Error) as exc:
                log.debug("chunk %d of %s to %s failed: %s", i, sid, agent_id, exc)
                failed.set()
                return None
            finally:
                window.release()
            if not got.ok and i < count - 1:
                log.debug("chunk %d of %s refused by %s: %s", i, sid, agent_id, got.reason)
                failed.set()
            return got

        sends: list[asyncio.Task[DataAck | None]] = []
        try:
            for i in range(count):
                await window.acquire()
                if failed.is_set():
                    break
                sends.append(asyncio.ensure_future(chunk(i)))
            answers = await asyncio.gather(*sends)
        finally:
            for t in sends:
                t.cancel()
        if failed.is_set() or len(answers) < count:
            return None
        self.stats["streamed"] += 1
        return answers[-1]

    def _acked(self, entry: Retained, consumer: str) -> None:
        done = self.store.ack(entry.pipeline_id, entry.producer, consumer, entry.token)
        if done is not None:
            self._forget([done])

    def _forget(self, entries: list[Retained]) -> None:
        """Released outputs: their object copies go too (the bucket TTL is the backstop)."""
        for e in entries:
            self._refused = {r for r in self._refused if r[:2] != e.key}
            if e.object_key is not None:
                if self.online:
                    self.spawn(self._delete_object(e.object_key))
                # a delivered output still kept is put there again if it is fetched
                self.store.set_object(e, None)

    async def _delete_object(self, key: str) -> None:
        with contextlib.suppress(Exception):
            await self.objects.delete(self.js, key)

    async def on_fetch(self, req: FetchRequest, level: int = 0) -> DataTransfer:
        """A (re-placed) consumer asks for a retained output (`level`: the wire level its
        agent reads, said by the request; the reply is written for it by `respond`, and so
        is what is pushed there later)."""
        self.note_level(req.agent_id, level)
        entry = self.store.get(req.pipeline_id, req.producer)
        if entry is None or (req.token is not None and req.token != entry.token):
            if (req.pipeline_id, req.producer) in self.core.jobs:
                routes = self._routes.setdefault((req.pipeline_id, req.producer), {})
                routes[req.consumer] = req.agent_id
                raise ServiceError(
                    "unavailable", f"{req.producer} has not finished; it is sent when it does"
                )
            raise ServiceError("not_found", f"no retained output of {req.producer}")
        self.store.route(req.pipeline_id, req.producer, req.consumer, req.agent_id)
        self._refused.discard((req.pipeline_id, req.producer, req.consumer))
        self.stats["fetches_served"] += 1
        if entry.size > self.config.object_threshold_bytes and self.at_site(req.agent_id):
            # at this site: sent in chunks to where it runs, not through the object store
            self.spawn(self._push(entry, req.consumer, req.agent_id))
            raise ServiceError("unavailable", f"{req.producer} is sent in chunks at this site")
        return await self._transfer(entry, req.consumer)

    async def on_ack(self, ack: DataAck, sender: str | None = None) -> DataAck:
        """A consumer's receipt of a fetched output, published by `sender` (the agent its
        subject names; None: the older subject, naming none): a receipt named by another
        agent than the one the consumer was routed to is ignored."""
        if ack.ok and ack.producer is not None and sender is not None:
            entry = self.store.get(ack.pipeline_id, ack.producer)
            if entry is not None and entry.consumers.get(ack.consumer) != sender:
                log.info(
                    "ignored a receipt of %s/%s for %s from agent %s: it runs on %s",
                    ack.pipeline_id, ack.producer, ack.consumer, sender,
                    entry.consumers.get(ack.consumer),
                )  # fmt: skip
                self.stats["misnamed_acks"] += 1
                return ack
        if ack.ok and ack.producer is not None:
            done = self.store.ack(ack.pipeline_id, ack.producer, ack.consumer, ack.token)
            if done is not None:
                self._forget([done])
                await self._notify()
        return ack

    def cancel(self, pipeline_id: str, task_ids: list[str] | None) -> None:
        self._forget(self.store.drop_pipeline(pipeline_id, task_ids))
        for key in [k for k in self._routes if k[0] == pipeline_id]:
            if task_ids is None or key[1] in task_ids:
                del self._routes[key]

    # -- consumer side --------------------------------------------------------------------------
    async def accept(self, transfer: DataTransfer, sender: str | None = None) -> DataAck:
        """An output arrived (inline, by reference, or the opening of a chunked sending) from
        `sender` (the agent the push's subject names, or that a fetch asked; None: the older
        subject naming none): check it, then hand it to the job."""
        key = (transfer.pipeline_id, transfer.consumer)
        job = self.core.jobs.get(key)
        if job is None:
            if self.core.finished(key):
                return self._ack(transfer, True, "already consumed")
            # a job a re-plan withdrew, too: its producer keeps the output for the task's
            # next placement, here or elsewhere, which asks for it
            return self._ack(transfer, False, "no such job")
        inp = next((i for i in job.offer.inputs if i.task_id == transfer.producer), None)
        if (problem := producer_problem(inp, sender)) is not None:
            self.stats["misnamed_pushes"] += 1
            log.warning(
                "refused %s/%s -> %s: %s",
                transfer.pipeline_id, transfer.producer, transfer.consumer, problem,
            )  # fmt: skip
            return self._ack(transfer, False, problem)
        if transfer.stream is not None:
            return self._open(transfer, inp, sender)
        digest = None  # of an object, computed as it was read
        if transfer.object_key is None:
            assert transfer.data is not None
            data = transfer.data
        else:
            if self.js is None:
                return self._ack(transfer, False, "object store unreachable")
            flight = (transfer.pipeline_id, transfer.producer, transfer.consumer)
            self._receiving.add(flight)
            try:
                data, digest = await self.objects.read(self.js, transfer.object_key)
            except Exception as exc:
                return self._ack(
                    transfer, False, f"object {transfer.object_key} unreadable: {exc!r}"[:2048]
                )
            finally:
                self._receiving.discard(flight)
            self.stats["objects_fetched"] += 1
        ack = self._deliver(transfer, data, digest)
        await self._notify()
        return ack

    def _open(self, transfer: DataTransfer, inp: InputRef | None, sender: str | None) -> DataAck:
        """The opening of a chunked sending: taken (its chunks are awaited) when the job
        takes that output and there is room to assemble it."""
        if sender is None or transfer.stream is None:
            return self._ack(transfer, False, "a chunked sending must name its sender")
        if inp is None:
            return self._ack(transfer, False, f"{transfer.producer} is not an input")
        if inp.token and transfer.token != inp.token:
            return self._ack(
                transfer, False,
                f"output of {transfer.producer} under token {transfer.token}: this placement "
                f"of {transfer.consumer} takes its run under token {inp.token}",
            )  # fmt: skip
        flight = (transfer.pipeline_id, transfer.producer, transfer.consumer)
        for k, a in list(self._streams.items()):  # one sending per input: a retry replaces
            t = a.transfer
            if (t.pipeline_id, t.producer, t.consumer) == flight:
                del self._streams[k]
        busy = sum(a.size for a in self._streams.values())
        if busy + (transfer.size or 0) > STREAMING_MAX_BYTES:
            raise ServiceError("unavailable", f"assembling {busy} B already; try again")
        self._streams[(sender, transfer.stream)] = Assembly(transfer, sender)
        self._receiving.add(flight)
        return self._ack(transfer, True, "send the chunks")

    async def on_chunk(self, msg: Msg, sender: str) -> DataAck:
        """One chunk of a chunked sending from `sender`: an error (the producer tries the
        whole sending again) when it is not the next one of a sending open here; the last
        one's answer is the transfer's, once its bytes are checked and handed to the job."""
        stream, _, index = (msg.headers or {}).get(CHUNK_HEADER, "").partition(" ")
        a = self._streams.get((sender, stream))
        if a is None:
            raise ServiceError("not_found", f"no sending {stream[:64]} from {sender} open here")
        t = a.transfer
        flight = (t.pipeline_id, t.producer, t.consumer)
        data = msg.data
        if index != str(a.next) or a.got + len(data) > a.size or not data:
            self._drop_stream((sender, stream))
            raise ServiceError(
                "unavailable", f"chunk {index[:16]} of {stream[:64]}: chunk {a.next} expected"
            )
        a.buf[a.got : a.got + len(data)] = data
        a.digest.update(data)
        a.got += len(data)
        a.next += 1
        a.at = time.monotonic()
        if a.got < a.size:
            return self._ack(t, True)
        del self._streams[(sender, stream)]
        self._receiving.discard(flight)
        self.stats["streams_received"] += 1
        ack = self._deliver(t, bytes(a.buf), a.digest.hexdigest())
        await self._notify()
        return ack

    async def answer_chunk(self, msg: Msg, sender: str) -> None:
        """Answer one chunk (`on_chunk`): its `DataAck`, or an error envelope."""
        try:
            body, headers = encode(await self.on_chunk(msg, sender)), headers_for("msgpack")
        except ServiceError as exc:
            body, headers = error_reply(exc.code, exc.message, exc.details, "msgpack")
        except Exception as exc:  # the agent stays up
            log.exception("chunk from %s", sender)
            body, headers = error_reply("internal", f"{type(exc).__name__}: {exc}"[:500])
        if msg.reply and self.nc is not None:
            await self.nc.publish(msg.reply, body, headers=headers)

    def _drop_stream(self, key: tuple[str, str]) -> None:
        a = self._streams.pop(key, None)
        if a is not None:
            t = a.transfer
            self._receiving.discard((t.pipeline_id, t.producer, t.consumer))

    def _ack(self, transfer: DataTransfer, ok: bool, reason: str = "") -> DataAck:
        return DataAck(
            pipeline_id=transfer.pipeline_id,
            consumer=transfer.consumer,
            ok=ok,
            reason=reason,
            producer=transfer.producer,
            token=transfer.token,
        )

    def _deliver(self, transfer: DataTransfer, data: bytes, digest: str | None = None) -> DataAck:
        problem = check_payload(data, transfer.sha256, transfer.size, digest)
        if problem is not None:
            self.stats["rejected"] += 1
            log.warning(
                "refused %s/%s -> %s: %s",
                transfer.pipeline_id,
                transfer.producer,
                transfer.consumer,
                problem,
            )
            return self._ack(transfer, False, problem)
        got = self.core.deliver(transfer, data)
        if got.ok:
            self.stats["inputs"] += 1
            self.on_input()
        return self._ack(transfer, got.ok, got.reason)

    def fetch_missing(
        self, jobs: list[Job], *, ready_only: bool = False, force: bool = False
    ) -> None:
        """Ask producers for inputs of committed jobs that have not arrived.

        `ready_only`: just those the orchestrator says exist already (at commit); `force`:
        now, whatever the backoff says (after a re-offer or a reconnect).
        """
        now = time.monotonic()
        for job in jobs:
            if not job.committed or job.state != "accepted":
                continue
            for inp in job.offer.inputs:
                if inp.task_id in job.inputs or (ready_only and not inp.ready):
                    continue
                flight = (job.offer.pipeline_id, inp.task_id, job.offer.task.id)
                if flight in self._fetching or flight in self._receiving:
                    continue  # asked for already, or arriving (a large object takes a while)
                due, _ = self._next_fetch.get(flight, (now + SWEEP_S, SWEEP_S))
                if flight not in self._next_fetch and not (force or ready_only):
                    self._next_fetch[flight] = (due, SWEEP_S)  # first sweep: give the push time
                    continue
                if not force and not ready_only and now < due:
                    continue
                _backoff(self._next_fetch, flight)
                self._fetching.add(flight)
                self.spawn(self._fetch(job, inp.task_id, inp.agent_id, flight))

    async def _fetch(
        self, job: Job, producer: str, agent_id: str, flight: tuple[str, str, str]
    ) -> None:
        pid, consumer = job.offer.pipeline_id, job.offer.task.id
        try:
            if agent_id == self.agent_id:
                entry = self.store.get(pid, producer)
                if entry is not None:
                    self.store.route(pid, producer, consumer, self.agent_id)
                    await self._push(entry, consumer, self.agent_id)
                elif (pid, producer) not in self.core.jobs:
                    await self._input_gone(job, producer, agent_id)
                return
            if not self.online:
                return
            assert self.nc is not None
            # only the producer run this placement takes (a run since superseded may still
            # be retained where it ran)
            token = next((i.token for i in job.offer.inputs if i.task_id == producer), 0)
            req = FetchRequest(
                pipeline_id=pid,
                producer=producer,
                consumer=consumer,
                agent_id=self.agent_id,
                token=token or None,
            )
            try:
                transfer = await request(
                    self.nc, subjects.fetch(agent_id), req, DataTransfer, timeout=5.0
                )
            except RemoteError as exc:
                log.debug("fetch %s/%s from %s: %s", pid, producer, agent_id, exc)
                if exc.code == "not_found":
                    await self._input_gone(job, producer, agent_id)
                return
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("fetch %s/%s from %s failed: %s", pid, producer, agent_id, exc)
                return
            ack = await self.accept(transfer, agent_id)  # (the agent asked)
            self.stats["fetched"] += ack.ok
            inp = next((i for i in job.offer.inputs if i.task_id == producer), None)
            if inp is not None and inp.wire >= SENDER_SUBJECTS:
                where = subjects.data_ack_from(agent_id, self.agent_id)
            else:
                where = subjects.data_ack(agent_id)  # an agent of an older level hears that
            await self.nc.publish(where, encode(ack))
        finally:
            self._fetching.discard(flight)

    async def _input_gone(self, job: Job, producer: str, agent_id: str) -> None:
        """Tell the orchestrators that `producer`'s agent holds no output for `job`: nobody
        will send it, and waiting for the stall watchdog to find that out takes two of its
        looks. Sent again at each fetch that finds it so (the fetch's backoff paces it)."""
        if not self.online or not job.offer.token:
            return
        assert self.nc is not None
        self.stats["inputs_gone"] += 1
        note = InputGone(
            pipeline_id=job.offer.pipeline_id, consumer=job.offer.task.id,
            token=job.offer.token, agent_id=self.agent_id, producer=producer,
            producer_agent=agent_id,
        )  # fmt: skip
        with contextlib.suppress(nats.errors.Error):
            await self.nc.publish(
                subjects.input_gone(note.pipeline_id, self.agent_id), encode(note)
            )

    # -- upkeep ---------------------------------------------------------------------------------
    async def sweep(self, *, force: bool = False) -> None:
        """Expire old outputs, retry unsent pushes, re-ask for missing inputs."""
        idle = time.monotonic() - STREAM_IDLE_S
        for k in [k for k, a in self._streams.items() if a.at < idle]:
            log.info("dropped sending %s from %s: no chunk for %.0f s", k[1], k[0], STREAM_IDLE_S)
            self._drop_stream(k)
        expired = self.store.expire()
        if expired:
            log.info("retention: %d outputs expired", len(expired))
            self._forget(expired)
            await self._notify()
        jobs = self.core.jobs
        self._next_fetch = {k: v for k, v in self._next_fetch.items() if (k[0], k[2]) in jobs}
        self._next_push = {k: v for k, v in self._next_push.items() if k[:2] in self.store.entries}
        if not self.online:
            return
        now = time.monotonic()
        for entry in list(self.store.entries.values()):
            due = [
                c
                for c in entry.unacked()
                if force or self._next_push.get((*entry.key, c), (0.0, 0.0))[0] <= now
            ]
            if due:
                self.spawn(self.push_all(entry))
        self.fetch_missing(list(jobs.values()), force=force)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)  # upkeep cadence, not synchronisation
            await self.sweep()
