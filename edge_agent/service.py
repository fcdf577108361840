"""The agent's asyncio shell: NATS I/O around `AgentCore`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from edge_agent import values
from edge_agent.allowlist import Allowlist, bundle_problem
from edge_agent.artifacts import ArtifactCache
from edge_agent.bundle_runner import run_bundle
from edge_agent.calibrate import Recalibrator
from edge_agent.config import AgentConfig
from edge_agent.core import AgentCore, Job, Overlaps
from edge_agent.dataplane import CHUNK_HEADER, DataPlane
from edge_agent.discover import build_devices
from edge_agent.exec_runner import run_exec
from edge_agent.executors import ExecutionError, OnnxExecutor, Output, run_synthetic
from edge_agent.journal import Journal
from edge_agent.linkprobe import LinkProber, answer_probe
from edge_agent.outbox import Outbox, connect_agent
from edge_agent.outputs import OutputStore, output_key
from edge_agent.pipeline_inputs import fetch as fetch_input
from edge_agent.py_runner import run_python
from edge_agent.sharedconn import SharedConnection
from schemas import subjects
from schemas.agent import AgentAdvert, CalibrationDrift, DeviceSpec, Heartbeat
from schemas.api import TASK_ENDED_STATES, TERMINAL_STATES, StatusReply, StatusRequest
from schemas.codec import RemoteError, encode, headers_for
from schemas.errors import ServiceError
from schemas.events import TaskEvent, TaskEventState
from schemas.pipeline import ExecRun, MediaType, OnnxRun, PythonRun, SyntheticRun, artifact_of
from schemas.placement import (
    CancelCommand,
    CommitCommand,
    DataAck,
    DataTransfer,
    DrainCommand,
    DrainReply,
    FetchRequest,
    JobHeld,
    JobQuery,
    JobReply,
    OfferBatch,
    OfferBatchReply,
    OfferReply,
    TaskOffer,
)
from schemas.wire import level_of
from transport import connect
from transport.rpc import request, respond, settle

log = logging.getLogger("mars.agent")
#: Outputs larger than this are hashed in a worker thread (hashlib lets go of the GIL).
HASH_INLINE_BYTES = 1 << 20
VERSION = "0.1.0"
#: A job not started after this long (inputs missing, or never committed) is checked against
#: its pipeline's status (`Agent.check_stale`); again at most this often.
STALE_CHECK_S = 60.0
STATUS_TIMEOUT_S = 2.0
ADVERT_EVERY = 10  # heartbeats


class Agent:
    def __init__(
        self,
        nats_url: str,
        config: AgentConfig,
        *,
        agent_id: str | None = None,
        calibrate: bool = True,
        shared: SharedConnection | None = None,
    ) -> None:
        """`shared`: a connection this agent borrows with others of its process (an emulated
        fleet) instead of one of its own."""
        self.nats_url = nats_url
        self.shared = shared
        self.config = config
        self.agent_id = agent_id or config.agent_id or socket.gethostname().split(".")[0]
        self.incarnation = uuid.uuid4().hex[:16]
        self.devices = build_devices(config, calibrate=calibrate)
        self.onnx = OnnxExecutor(config.models_dir)
        self.output_store = OutputStore(config.output_keep_s)
        self.recal = Recalibrator(
            self.agent_id, self.incarnation, config.recalibrate_every_s, config.drift_threshold
        )
        self.links = LinkProber(self.agent_id, config, advert_every=ADVERT_EVERY)
        self.core = AgentCore(
            self.agent_id,
            self.incarnation,
            self.devices,
            list(config.allowed_kinds),
            self.onnx.has_model,
            allowlist=Allowlist(
                tuple(config.exec_allow), tuple(config.python_allow), config.allow_shipped_code
            ),
        )
        self.nc: NATS | None = None
        #: This agent's subscriptions: on a shared connection, stopping ends only these.
        self._subs: list[Subscription] = []
        self._seq = 0
        self._event_seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running: dict[tuple[str, str], asyncio.Task[Any]] = {}
        #: The call of `_start_ready` for a job held back by a booked window, and when it is
        #: due (monotonic).
        self._recheck: tuple[asyncio.TimerHandle | None, float] = (None, 0.0)
        self._stopped = asyncio.Event()
        #: How long a job may wait without starting before its pipeline's status is asked.
        self.stale_check_s = STALE_CHECK_S
        #: Set whenever jobs start, finish or are dropped: drain and shutdown wait on it.
        self._jobs_changed = asyncio.Event()
        # offline autonomy: events journaled on disk, outputs retained until acknowledged
        self._own_state = config.buffer_dir is None
        self.state_dir = (
            Path(config.buffer_dir) / self.agent_id
            if config.buffer_dir
            else Path(tempfile.mkdtemp(prefix=f"mars-agent-{self.agent_id}-"))
        )
        #: Models and bundles tasks name `name@sha256`, fetched on first use.
        self.artifacts = ArtifactCache(
            Path(config.artifact_cache_dir) / self.agent_id
            if config.artifact_cache_dir
            else self.state_dir / "artifacts",
            config.artifact_cache_max_bytes,
            fetch_timeout_s=config.artifact_fetch_timeout_s,
            on_evict=self.onnx.forget,
            on_change=self._artifacts_changed,
        )
        self.onnx.artifacts = self.artifacts
        self.onnx.on_warm_change = self._models_changed
        #: The loop this agent runs on, once started (a model's session is made in a worker
        #: thread, and advertised from here).
        self._loop: asyncio.AbstractEventLoop | None = None
        journal = Journal(
            self.state_dir / "events.journal", config.buffer_max_bytes, fsync=config.buffer_fsync
        )
        self.outbox = Outbox(journal)
        self.data = DataPlane(
            self.agent_id,
            self.core,
            config,
            self.state_dir / "outputs",
            on_input=self._start_ready,
            spawn=self._spawn,
        )
        #: Set while connected to NATS, and while not (tests and operators watch both).
        self.online = asyncio.Event()
        self.offline = asyncio.Event()
        #: Awaited as each job's run begins, before its task (its start timer set): a hold
        #: put on runs from outside, to emulate a device slowed or paused (tests, emulated
        #: fleets). None: tasks run at once.
        self.before_run: Callable[[Job], Awaitable[None]] | None = None
        #: The jobs running now, and how many others each has run alongside (its end event
        #: says: `TaskEvent.shared`).
        self.overlaps = Overlaps()

    # -- lifecycle ------------------------------------------------------------------------------
    def advert(self) -> AgentAdvert:
        return AgentAdvert(
            agent_id=self.agent_id,
            incarnation=self.incarnation,
            site=self.config.site,
            tier=self.config.tier,
            hostname=socket.gethostname()[:256],
            labels=dict(self.config.labels),
            devices=self.devices,
            links=self.links.links(self.config.links),
            allowed_kinds=list(self.config.allowed_kinds),
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            version=VERSION,
            seq=self._seq,
            artifacts=self.artifacts.held(),
            nkey=connect.public_nkey(),
            warm_models=self.onnx.warm_models(),
        )

    async def start(self) -> None:
        if self.shared is not None:
            self.nc = await self.shared.join(
                self.agent_id, self._on_disconnected, self._on_reconnected
            )
        else:
            self.nc = await connect_agent(
                self.nats_url,
                f"mars-agent-{self.agent_id}",
                self._on_disconnected,
                self._on_reconnected,
                self.config.reconnect_base_s,
                self.config.reconnect_max_s,
            )
        nc = self.nc
        self._loop = asyncio.get_running_loop()
        self.data.attach(nc)
        self.artifacts.attach(connect.jetstream(nc))
        aid = self.agent_id
        for subject, cb in (
            (subjects.offer(aid), self._on_offer),
            (subjects.offers(aid), self._on_offers),
            (subjects.commit(aid), self._on_commit),
            (subjects.cancel(aid), self._on_cancel),
            (subjects.drain(aid), self._on_drain),
            (subjects.all_data_to(aid), self._on_data),  # each names its sender
            (subjects.data(aid), self._on_data),  # from agents of wire level 4 and older
            (subjects.all_data_acks_to(aid), self._on_data_ack),
            (subjects.data_ack(aid), self._on_data_ack),
            (subjects.fetch(aid), self._on_fetch),
            (subjects.job(aid), self._on_job),
            (subjects.DISCOVER, self._on_discover),
            (subjects.probe(aid), self._on_probe),
        ):
            self._subs.append(await nc.subscribe(subject, cb=cb))
        if self.links.enabled:
            self._subs.append(await self.links.attach(nc))
        await settle(nc)  # offers and probes sent once start returns find their subscriptions
        await self._publish_advert()
        self._spawn(self._heartbeat_loop())
        self._spawn(self._stale_loop())
        self.online.set()
        self.outbox.attach(nc)  # replays what a previous run left in the journal
        self._spawn(self.outbox.run())
        self._spawn(self.data.run())
        self._spawn(self.data.sweep(force=True))  # outputs retained by a previous run
        if self.links.enabled:
            self._spawn(self.links.run(nc, self._stopped, self._publish_advert))
        if self.recal.active(self.devices):
            self._spawn(
                self.recal.run(
                    lambda: self.devices,
                    lambda: self.core.running_total > 0,
                    self._on_drift,
                    self._stopped,
                )
            )
        log.info(
            "agent %s (%s) up with %d devices", self.agent_id, self.incarnation, len(self.devices)
        )

    async def stop(self) -> None:
        if self.nc is not None and self.nc.is_connected:
            await self.outbox.wait_empty(1.0)  # bounded: what is left stays journaled
        self._stopped.set()
        if self._recheck[0] is not None:
            self._recheck[0].cancel()
        # until none is left: a task's own clean-up may spawn another (cancelled at once), and
        # no write may reach the state directory once it is removed below
        while left := [t for t in self._tasks if not t.done()]:
            for t in left:
                t.cancel()
            for t in left:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        await self.artifacts.close()  # fetches under way end (their part files deleted)
        if self.shared is not None:
            self.shared.leave(self.agent_id)
            for sub in self._subs:  # the connection is the fleet's: only ours end
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            if self._subs and self.nc is not None and self.nc.is_connected:
                with contextlib.suppress(Exception):
                    await settle(self.nc)  # stopped: the server routes nothing here any more
        elif self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            if not self.nc.is_closed:  # drain refuses while reconnecting
                with contextlib.suppress(Exception):
                    await self.nc.close()
        self._subs.clear()
        self.nc = None
        self.outbox.journal.close()
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        else:
            self.data.store.spill_all()  # a restart finds what is not yet acknowledged

    # -- drain and graceful shutdown ----------------------------------------------------------
    def drain(self, deadline_s: float | None = None) -> None:
        """Accept no new offers; accepted work carries on. After `deadline_s` (if given),
        whatever is still running or queued is cancelled."""
        self.core.draining = True
        if deadline_s is not None:
            self._spawn(self._drain_deadline(deadline_s))

    def resume(self) -> None:
        self.core.draining = False

    async def _drain_deadline(self, deadline_s: float) -> None:
        if not await self.wait_idle(deadline_s) and self.core.draining:
            await self.cancel_all("drain deadline passed")

    async def wait_idle(self, timeout: float) -> bool:
        """Wait (on job changes, not by polling) until no job is held; False on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.core.jobs:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._jobs_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._jobs_changed.wait(), left)
        return True

    async def cancel_all(self, reason: str) -> None:
        """Cancel every job: queued ones are reported cancelled here, running ones by
        `_execute` once their task (and any exec process group) is stopped."""
        stopping = []
        for job in self.core.abandon():
            task = self._running.get(job.key)
            if task is not None:
                task.cancel()
                stopping.append(task)
            elif job.state == "cancelled":
                self._emit(job, "cancelled", error=reason)
        self._jobs_changed.set()
        if stopping:
            await asyncio.wait(stopping, timeout=10.0)

    async def shutdown(self, grace_s: float) -> None:
        """Drain, let running and accepted work finish for up to `grace_s`, cancel the rest
        (each gets a `cancelled` event), then stop."""
        self.drain()
        if not await self.wait_idle(grace_s):
            log.info("grace of %.1f s over: cancelling %d jobs", grace_s, len(self.core.jobs))
            await self.cancel_all("agent shut down")
        await self.stop()

    def _drain_reply(self) -> DrainReply:
        running = self.core.running_total
        return DrainReply(
            agent_id=self.agent_id,
            draining=self.core.draining,
            running=running,
            queued=max(0, len(self.core.jobs) - running),
        )

    async def _on_drain(self, msg: Msg) -> None:
        async def drain(cmd: DrainCommand) -> DrainReply:
            if cmd.agent_id != self.agent_id:
                raise ServiceError("bad_request", f"drain for agent {cmd.agent_id}")
            if cmd.resume:
                self.resume()
            else:
                self.drain(cmd.deadline_s)
            log.info("agent %s %s", self.agent_id, "draining" if self.core.draining else "resumed")
            return self._drain_reply()

        await respond(self.nc, msg, DrainCommand, drain)

    async def _on_job(self, msg: Msg) -> None:
        async def job(q: JobQuery) -> JobReply:
            return JobReply(pipeline_id=q.pipeline_id, task_id=q.task_id, state=self.job_state(q))

        await respond(self.nc, msg, JobQuery, job)

    def job_state(self, q: JobQuery) -> JobHeld:
        """Whether this agent holds the job under the token; an ended one's end event is sent
        again (ignored by the journal if it was delivered), and for one held by nobody a
        `cancelled` event under the token says so: its owner places it again. A job offered
        provisionally (a first round's offer, token 0) and not committed yet is held under
        the token its commit brings, as `AgentCore.commit` takes it: answered `gone`, a
        task whose commit was still on its way (backing off while the agent reconnected) was
        placed again for nothing."""
        key = (q.pipeline_id, q.task_id)
        held = self.core.jobs.get(key)
        if held is not None and held.offer.token in (0, q.token):
            return "held"
        end = self.core.end_of(key, q.token)
        if end is not None:
            self.outbox.emit(*end)
            return "ended"
        log.warning(
            "asked about %s/%s under token %d: no such job here; saying it is cancelled",
            q.pipeline_id, q.task_id, q.token,
        )  # fmt: skip
        self._seq_event(
            q.pipeline_id, q.task_id, q.device_id, q.token, "cancelled",
            error=f"{self.agent_id} holds no job of {q.task_id} under token {q.token}",
        )  # fmt: skip
        return "gone"

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._stopped.is_set():
            task.cancel()  # spawned by a task being stopped: it never starts
        return task

    def _artifacts_changed(self) -> None:
        """An artifact fetched or evicted: advertised at once, for placement to know who
        holds it (the periodic advert would say so too, later)."""
        if self.nc is not None and self.online.is_set():
            self._spawn(self._publish_advert())

    def _models_changed(self) -> None:
        """A model's session made or dropped (`OnnxExecutor.warm_models`), in a worker
        thread or this one: advertised at once, for placement to charge its load only to
        agents without it (the next periodic advert would say so too, later)."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: there is no one to tell
                loop.call_soon_threadsafe(self._artifacts_changed)

    async def _publish_advert(self) -> None:
        assert self.nc is not None
        # the headers name this release's wire level: offers to it carry all it reads
        await self.nc.publish(
            subjects.advert(self.agent_id), encode(self.advert()), headers=headers_for("msgpack")
        )

    async def _heartbeat_loop(self) -> None:
        """A sparse heartbeat (`heartbeat_interval_s`): the backstop of presence, and how the
        orchestrators hear `running` and `draining`."""
        assert self.nc is not None
        interval = self.config.heartbeat_interval_s
        while not self._stopped.is_set():
            self._seq += 1
            hb = Heartbeat(
                agent_id=self.agent_id,
                incarnation=self.incarnation,
                seq=self._seq,
                running=self.core.running_total,
                draining=self.core.draining,
            )
            if self.nc.is_connected:  # offline, stale heartbeats would pile up in the client
                with contextlib.suppress(Exception):
                    await self.nc.publish(subjects.heartbeat(self.agent_id), encode(hb))
                    if self._seq % ADVERT_EVERY == 0:
                        await self._publish_advert()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), interval)

    # -- commands -------------------------------------------------------------------------------
    async def _on_discover(self, msg: Msg) -> None:
        await self._publish_advert()

    async def _on_probe(self, msg: Msg) -> None:
        await answer_probe(self.nc, msg)

    async def _on_drift(self, drifted: list[tuple[DeviceSpec, CalibrationDrift]]) -> None:
        """Advertise the re-measured figures at once, and publish why (the drift notices)."""
        new = {d.device_id: d for d, _ in drifted}
        self.devices = [new.get(d.device_id, d) for d in self.devices]
        assert self.nc is not None
        for _, notice in drifted:
            await self.nc.publish(subjects.drift(self.agent_id), encode(notice))
        await self._publish_advert()

    def _admit(self, offer: TaskOffer) -> OfferReply:
        reply = self.core.admit(offer)
        if not reply.accepted:
            log.info(
                "rejected %s/%s: %s %s",
                offer.pipeline_id,
                offer.task.id,
                reply.code,
                reply.reason,
            )
        else:
            job = self.core.jobs.get((offer.pipeline_id, offer.task.id))
            if job is not None and job.committed:  # re-offered with new routing
                self.data.fetch_missing([job], force=True)
            if (artifact := artifact_of(offer.task.run)) is not None:
                self._spawn(self.artifacts.prefetch(*artifact))  # the run waits for it
        return reply

    async def _on_offer(self, msg: Msg) -> None:
        async def admit(offer: TaskOffer) -> OfferReply:
            return self._admit(offer)

        await respond(self.nc, msg, TaskOffer, admit)

    async def _on_offers(self, msg: Msg) -> None:
        async def admit_all(batch: OfferBatch) -> OfferBatchReply:
            self.core.set_clock(batch.sent_at)
            return OfferBatchReply(replies=[self._admit(offer) for offer in batch.offers])

        await respond(self.nc, msg, OfferBatch, admit_all)

    async def _on_commit(self, msg: Msg) -> None:
        async def commit(cmd: CommitCommand) -> CommitCommand:
            self.core.set_clock(cmd.sent_at)
            jobs = [
                j for t in cmd.task_ids if (j := self.core.jobs.get((cmd.pipeline_id, t)))
            ]  # fmt: skip
            # Committed before: the orchestrator asks again because it sees them free to
            # start (every input made) but not started, so an input may have been lost on
            # its way here: ask the producers now rather than at the next sweep.
            again = [j for j in jobs if j.committed]
            fresh = [j for j in jobs if not j.committed]
            self.core.commit(cmd)
            fresh = [j for j in fresh if j.committed]  # not one without a current token
            self._start_ready()
            self.data.fetch_missing(fresh, ready_only=True)
            self.data.fetch_missing(again, force=True)
            return cmd

        await respond(self.nc, msg, CommitCommand, commit)

    async def _on_cancel(self, msg: Msg) -> None:
        async def cancel(cmd: CancelCommand) -> CancelCommand:
            self._withdraw(cmd)
            return cmd

        await respond(self.nc, msg, CancelCommand, cancel)

    def _withdraw(self, cmd: CancelCommand) -> None:
        for job in self.core.cancel(cmd):
            running = self._running.get(job.key)
            if running is not None:
                running.cancel()  # an exec task's process group is killed with it
        self.data.cancel(cmd.pipeline_id, cmd.task_ids)
        self._start_ready()  # a window held by a job withdrawn is free

    # -- jobs nobody will start -----------------------------------------------------------------
    async def _stale_loop(self) -> None:
        while True:
            await asyncio.sleep(self.stale_check_s / 4)  # a cadence, not synchronisation
            await self.check_stale()

    async def check_stale(self, now: float | None = None) -> int:
        """Ask the API about each pipeline with a job here that has waited `stale_check_s`
        without starting, and drop the jobs it says are over: the pipeline ended, or the task
        is placed elsewhere now. The withdrawal the orchestrator sent was lost (this agent was
        cut off then), and such a job would wait, and ask for inputs, for ever. Returns how
        many were dropped; a pipeline the API cannot answer for keeps its jobs. (A replica
        other than the owner answers from the pipeline's record, written after every
        re-placement: only a record whose write keeps failing could still show a task's old
        place after a move back here.)"""
        now = time.monotonic() if now is None else now
        if self.nc is None or not self.nc.is_connected:
            return 0
        by_pipeline: dict[str, list[Job]] = {}
        for job in self.core.stale_candidates(now - self.stale_check_s):
            job.checked = now
            by_pipeline.setdefault(job.offer.pipeline_id, []).append(job)
        dropped = 0
        for pid, jobs in sorted(by_pipeline.items()):
            try:
                st = await request(
                    self.nc, subjects.STATUS, StatusRequest(pipeline_id=pid), StatusReply,
                    timeout=STATUS_TIMEOUT_S,
                )  # fmt: skip
            except (TimeoutError, nats.errors.Error, RemoteError) as exc:
                log.debug("status of %s for its waiting jobs: %s", pid, exc)
                continue
            where = {t.task_id: (t.agent_id, t.device_id) for t in st.tasks}
            for job in jobs:
                tid, here = job.offer.task.id, (self.agent_id, job.offer.device_id)
                if st.state in TERMINAL_STATES:
                    why = f"pipeline {st.state}"
                elif (now_at := where.get(tid, here)) != here:
                    why = f"placed on {now_at[0]}:{now_at[1]} now"
                else:
                    continue
                log.info("dropping waiting job %s/%s (token %d): %s",
                         pid, tid, job.offer.token, why)  # fmt: skip
                self._withdraw(
                    CancelCommand(
                        pipeline_id=pid, task_ids=[tid], max_token=job.offer.token,
                        reason=f"waited {now - job.since:.0f} s: {why}",
                    )
                )  # fmt: skip
                dropped += 1
        return dropped

    async def _on_data(self, msg: Msg) -> None:
        """A pushed output, or a chunk of one sent in chunks, from the agent the subject
        names (None: the older subject, naming none)."""
        sender = subjects.sender_of(msg.subject)
        if sender is not None and msg.headers and CHUNK_HEADER in msg.headers:
            await self.data.answer_chunk(msg, sender)
            return

        async def accept(transfer: DataTransfer) -> DataAck:
            return await self.data.accept(transfer, sender)

        await respond(self.nc, msg, DataTransfer, accept)

    async def _on_fetch(self, msg: Msg) -> None:
        async def fetch(req: FetchRequest) -> DataTransfer:
            return await self.data.on_fetch(req, level_of(msg.headers))

        await respond(self.nc, msg, FetchRequest, fetch)

    async def _on_data_ack(self, msg: Msg) -> None:
        async def ack(a: DataAck) -> DataAck:
            return await self.data.on_ack(a, subjects.sender_of(msg.subject))

        await respond(self.nc, msg, DataAck, ack)

    # -- connectivity ---------------------------------------------------------------------------
    async def _on_disconnected(self) -> None:
        if self.online.is_set() and not self._stopped.is_set():
            log.warning(
                "agent %s lost NATS; tasks keep running, events are journaled", self.agent_id
            )
        self.online.clear()
        self.offline.set()

    async def _on_reconnected(self) -> None:
        log.info(
            "agent %s reconnected; replaying %d events", self.agent_id, len(self.outbox.journal)
        )
        self.offline.clear()
        self.online.set()
        self.outbox.wake()
        self._spawn(self.data.sweep(force=True))
        with contextlib.suppress(Exception):
            await self._publish_advert()

    # -- execution ------------------------------------------------------------------------------
    def _start_ready(self) -> None:
        for job in self.core.take_ready():
            self.overlaps.begin(job)
            task = self._running[job.key] = self._spawn(self._execute(job))
            task.add_done_callback(functools.partial(self._ended, job))
        self._recheck_at(self.core.recheck_at)
        self._jobs_changed.set()

    def _recheck_at(self, at: float | None) -> None:
        """A ready job held back by a booked window goes when the hold ends, if nothing
        (that window's job becoming ready, a slot freed) starts it sooner."""
        if at is None:
            return
        timer, due = self._recheck
        if timer is not None and not timer.cancelled() and due <= at + 1e-3:
            return  # one due sooner already
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._recheck = (loop.call_later(max(0.0, at - time.monotonic()), self._start_ready), at)

    def _ended(self, job: Job, task: asyncio.Task[None]) -> None:
        """A run cancelled before its first step never enters `_execute`, whose `finally`
        lets the job and its slot go: done here instead (found as a device that ran nothing
        more, its slot held by a job withdrawn as it started)."""
        if self.core.never_ran(job):
            self.overlaps.end(job)
            if self._running.get(job.key) is task:
                del self._running[job.key]
            log.debug("%s/%s withdrawn as it started", *job.key)
            self._start_ready()

    def _device(self, job: Job) -> DeviceSpec:
        return self.core.devices[job.offer.device_id]

    async def _execute(self, job: Job) -> None:
        offer = job.offer
        t0 = time.perf_counter()
        ok = False
        shared: int | None = None  # (said once its run ends: what it did after runs alone)
        try:
            out = await self._run_reported(job, t0)
            shared = self.overlaps.end(job)
            # an ONNX run says its model runs' time alone, its load and session apart (what
            # the predictor predicts); other runs their wall time
            duration = out.run_s if out.run_s is not None else time.perf_counter() - t0
            # kept until every consumer has it, from now on (its job is let go below);
            # shipped in the background, offline or not, to where the consumers are now (a
            # routing update may have come while it ran)
            # hashed once, for retention, consumers' checks and the end event; a large output
            # off the event loop (heartbeats and offers go on meanwhile), its put into the
            # object store begun meanwhile when it will cross by object
            if len(out.data) > HASH_INLINE_BYTES:
                hashing = asyncio.ensure_future(asyncio.to_thread(sha256_hex, out.data))
                early = self.data.preput(offer, out.data, hashing)
                try:
                    digest = await hashing
                except BaseException:
                    if early is not None:
                        early.cancel()  # (withdrawn meanwhile: nothing of it is kept)
                    raise
            else:
                early, digest = None, sha256_hex(out.data)
            made = self.data.keep(
                job.offer, out.data, made_as(offer.task.output_type, out), sha256=digest
            )
            if early is not None:
                self.data.adopt(made, early)
            self._spawn(self.data.send_kept(made))
            ok = True
            kept = await self._keep_output(job, out)
            self._emit(
                job, "succeeded", duration=duration, output=out, kept=kept, digest=digest,
                shared=shared,
            )  # fmt: skip
        except asyncio.CancelledError:
            shared = self.overlaps.end(job) if shared is None else shared
            self._emit(job, "cancelled", duration=time.perf_counter() - t0, shared=shared)
        except Exception as exc:
            log.warning("task %s/%s failed: %s", offer.pipeline_id, offer.task.id, exc)
            shared = self.overlaps.end(job) if shared is None else shared
            self._emit(
                job,
                "failed",
                duration=time.perf_counter() - t0,
                error=f"{type(exc).__name__}: {exc}",
                shared=shared,
            )
        finally:
            self.overlaps.end(job)
            self._running.pop(job.key, None)
            self.core.finish(job.key, ok)
            self._start_ready()

    async def _keep_output(self, job: Job, out: Output) -> str | None:
        """Keep a task's output for fetching (`edge_agent.outputs`) before its end is said:
        its key, or None (a synthetic task's placeholder, an output other tasks take whose
        spec does not ask for it to be kept, or not written: offline, slow). The bucket is
        at the hub: an intermediate output kept there would cross the site's uplink."""
        o = job.offer
        if (
            isinstance(o.task.run, SyntheticRun)
            or (o.consumers and not o.task.keep_output)
            or self.data.js is None
            or not self.data.online
        ):
            return None
        key = output_key(o.pipeline_id, o.task.id, o.token)
        return key if await self.output_store.put(self.data.js, key, out.data) else None

    async def _run_reported(self, job: Job, t0: float) -> Output:
        """Run the job; its `started` event goes out once it has run `started_event_after_s`
        (saying for how long: the orchestrator dates the start by it). A task done sooner is
        reported once, by its end event: short tasks cost half the events."""

        def report() -> None:
            self._emit(job, "started", duration=time.perf_counter() - t0)

        after = self.config.started_event_after_s
        if after <= 0.0:
            report()
            return await self._held_run(job)
        start = asyncio.get_running_loop().call_later(after, report)
        try:
            return await self._held_run(job)
        finally:
            start.cancel()  # not sent by now: the end event says it all

    async def _held_run(self, job: Job) -> Output:
        if self.before_run is not None:
            await self.before_run(job)
        return await self._run(job)

    async def _run(self, job: Job) -> Output:
        """Run the job's task on its inputs: decoded and bound by name for onnx and python
        tasks, as files for exec ones (`edge_agent.values`)."""
        task = job.offer.task
        run = task.run
        device = self._device(job)
        if isinstance(run, SyntheticRun):
            return await run_synthetic(run, device)
        # as its producer's spec declares it, else as its producer's executor made it
        types: dict[str, MediaType | None] = {
            i.task_id: i.media_type or job.input_types.get(i.task_id) for i in job.offer.inputs
        }
        got = dict(job.inputs)
        for pi in job.offer.pipeline_inputs:  # the pipeline's own, from the inputs bucket
            if self.data.js is None:
                raise ExecutionError(f"pipeline input {pi.name}: no connection to fetch it")
            got[f"@{pi.name}"] = await fetch_input(self.data.js, pi)
            types[f"@{pi.name}"] = pi.media_type
        cfg = self.config
        if isinstance(run, OnnxRun):
            given = values.bind(task, got, types)
            async with self.artifacts.holding(run.model, "onnx"):  # an artifact: fetched first
                return await self.onnx.run(
                    run, device, timeout_s=cfg.onnx_timeout_s, inputs=given
                )  # fmt: skip
        if isinstance(run, ExecRun):
            return await run_exec(
                run,
                cfg.exec_allow,
                timeout_s=cfg.exec_timeout_s,
                max_output_bytes=cfg.exec_max_output_bytes,
                work_dir=cfg.exec_work_dir,
                inputs=values.raw(task, got, types),
            )
        if isinstance(run, PythonRun) and run.bundle is not None:
            if (refused := bundle_problem(run.entry, cfg.allow_shipped_code)) is not None:
                raise ExecutionError(f"not allowed: {refused}")  # and nothing fetched
            async with self.artifacts.holding(run.bundle, "python-bundle") as bundle:
                assert bundle is not None
                return await run_bundle(
                    run, bundle, allowed=cfg.allow_shipped_code,
                    timeout_s=cfg.python_timeout_s, max_output_bytes=cfg.python_max_output_bytes,
                    memory_mb=cfg.python_memory_mb, inputs=values.bind(task, got, types),
                    declared=task.output_type,
                )  # fmt: skip
        if isinstance(run, PythonRun):
            return await run_python(
                run,
                cfg.python_allow,
                timeout_s=cfg.python_timeout_s,
                max_output_bytes=cfg.python_max_output_bytes,
                memory_mb=cfg.python_memory_mb,
                inputs=values.bind(task, got, types),
                declared=task.output_type,
            )
        raise ExecutionError(f"no executor for kind {run.kind} in this agent")

    def _emit(
        self,
        job: Job,
        state: TaskEventState,
        *,
        duration: float | None = None,
        output: Output | None = None,
        error: str = "",
        kept: str | None = None,
        digest: str | None = None,
        shared: int | None = None,
    ) -> None:
        offer = job.offer
        ended = state in TASK_ENDED_STATES
        end = self._seq_event(
            offer.pipeline_id, offer.task.id, offer.device_id, offer.token, state,
            duration=duration, output=output, error=error,
            input_tokens=dict(job.input_tokens) if ended else None,
            output_key=kept, output_type=offer.task.output_type, output_sha256=digest,
            load_s=output.load_s if output else None, cold=output.cold if output else None,
            shared=shared if ended else None,
        )  # fmt: skip
        if state == "started":
            job.start_reported = True
        elif ended:
            self.core.remember_end(job.key, offer.token, *end)

    def _seq_event(
        self,
        pipeline_id: str,
        task_id: str,
        device_id: str,
        token: int,
        state: TaskEventState,
        *,
        duration: float | None = None,
        output: Output | None = None,
        error: str = "",
        input_tokens: dict[str, int] | None = None,
        output_key: str | None = None,
        output_type: MediaType | None = None,
        output_sha256: str | None = None,
        load_s: float | None = None,
        cold: bool | None = None,
        shared: int | None = None,
    ) -> tuple[str, str, bytes]:
        """Send a task event (subject, event id and data returned); `output_sha256`: the
        output's digest, when the caller has it."""
        self._event_seq += 1
        ev = TaskEvent(
            event_id=f"{self.incarnation}-{self._event_seq}",
            pipeline_id=pipeline_id,
            task_id=task_id,
            agent_id=self.agent_id,
            incarnation=self.incarnation,
            device_id=device_id,
            token=token,
            state=state,
            duration_s=duration,
            output_bytes=len(output.data) if output else 0,
            result=output.result[:256] if output else "",
            error=error[:2048],
            input_tokens=input_tokens,
            output_sha256=(output_sha256 or sha256_hex(output.data)) if output else None,
            output_type=(output_type or output.media_type) if output else None,
            output_key=output_key,
            load_s=load_s,
            cold=cold,
            shared=shared,
        )
        sent = (subjects.task_event(pipeline_id, task_id, self.agent_id), ev.event_id, encode(ev))
        # journaled first: sent now if connected, replayed in order after a reconnect or restart
        self.outbox.emit(*sent)
        return sent


def made_as(declared: MediaType | None, out: Output) -> MediaType | None:
    """What an output is said to be to its consumers: as its spec declares it, else as its
    executor made it; raw bytes are not said to be anything (bytes a task returned, an exec
    task's file: known by what they hold, e.g. a `.npy` header)."""
    if declared is not None:
        return declared
    return None if out.media_type == values.BYTES else out.media_type


async def run_agent(
    nats_url: str,
    config: AgentConfig,
    *,
    agent_id: str | None = None,
    stop: asyncio.Event | None = None,
    grace_s: float | None = None,
    started: asyncio.Event | None = None,
) -> None:
    """Run until `stop` is set, then shut down gracefully (see `Agent.shutdown`); `started`
    is set once the agent is up."""
    agent = Agent(nats_url, config, agent_id=agent_id)
    await agent.start()
    if started is not None:
        started.set()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await agent.shutdown(config.shutdown_grace_s if grace_s is None else grace_s)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
