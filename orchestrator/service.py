"""The orchestrator's asyncio shell: cluster view, API service, dispatch and event tracking."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
import uuid
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Sequence,
)
from typing import Any, TypeVar

import nats
import nats.micro
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import RetentionPolicy, StreamConfig
from nats.micro.request import Request
from pydantic import TypeAdapter, ValidationError

from orchestrator import eventloop, ownership
from orchestrator.adaptive import Adaptive
from orchestrator.commits import AGENT_ENCODING, OFFER_TIMEOUT_S, Commits
from orchestrator.displaced import Displaced
from orchestrator.eventloop import Pacer
from orchestrator.failover import OWNER_LEASE_S, Failover
from orchestrator.pipelines import PipelineRun
from orchestrator.placement import PlacementFailed, Placer
from orchestrator.planning import PLAN_BUDGET_S
from orchestrator.predictor.history import History
from orchestrator.predictor.model import ErrorStats, Predictor
from orchestrator.queries import Queries
from orchestrator.recovery import Recovery
from orchestrator.registry import ClusterView
from orchestrator.replicas import Replicas
from orchestrator.reservations.store import (
    KEY_MAX_BYTES,
    BookingStore,
    device_key_of,
    key_limit,
)
from orchestrator.scheduling import Placement, Unschedulable, compiled
from orchestrator.watchdog import STALL_S, Watchdog
from schemas import subjects
from schemas.agent import AgentAdvert, Heartbeat
from schemas.api import (
    TASK_ENDED_STATES,
    AgentsRequest,
    CancelRequest,
    ListRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from schemas.base import WireModel
from schemas.codec import (
    DecodeError,
    Encoding,
    decode,
    encode,
    encoding_of,
    error_reply,
    headers_for,
)
from schemas.events import PipelineEvent, TaskEvent
from schemas.limits import Ident
from schemas.pipeline import PipelineSpec
from schemas.placement import (
    CancelCommand,
    OfferBatch,
    OfferBatchReply,
    OfferReply,
    TaskOffer,
)
from schemas.rpc import (
    RemoteError,
    ServiceError,
    handle,
    let_sends_out,
    nats_error_logger,
    request,
    settle,
)
from schemas.wire import level_of

log = logging.getLogger("mars.orchestrator")
#: One debug record per placement with the time of each step (MARS_DEBUG=mars.timing).
timing_log = logging.getLogger("mars.timing")
#: ... its format (benchmarks/placement_latency.py reads it back).
TIMING_LINE = (
    "placed %s claim_ms=%.3f plan_ms=%.3f send_ms=%.3f book_ms=%.3f offer_ms=%.3f "
    "total_ms=%.3f budget_ms=%.1f conflicts=%d rejections=%d held_ms=%.3f start_mono=%.6f"
)
VERSION = "0.1.0"
#: Reservations expire this long after their last renewal.
LEASE_S = 15.0
#: A renewal gives the event loop a turn after reading about this many placements.
RENEW_SLICE_TASKS = 2000
#: Finished pipelines kept in memory (`list` shows the live ones and these; `status` of any
#: other is rebuilt from its record in KV). Every object kept is visited by each full garbage
#: collection, which stops the orchestrator: with 2,000 kept one took 80-300 ms; measured in
#: one process after 300 pipelines, 250 kept made ~140 of a 270 ms collection. The young ones
#: are visited by each young collection too: 64 kept (with the predictor's task memo, since
#: gone) made its longest pauses 33-48 ms in a placement benchmark run, 16 made them 26-32.
MAX_PIPELINES_KEPT = 16
#: ... trimmed back to that many each time this many more have come in.
TRIM_STEP = 16
#: Submissions one process serves at once. The planner stays one at a time (`Placer`); the
#: next submission's claim, and its wait for the planner, overlap the one before's offers,
#: commit and reply. Four at once shortened the wait of random arrivals when the host was
#: fast and lengthened their placements when it was slow (docs/placement-latency.md).
SUBMITS_AT_ONCE = 2
#: Submissions waiting for one of those at most; one more is answered `unavailable` at once
#: (the client hears "busy, try again", not a timeout).
MAX_QUEUED_SUBMITS = 1024
#: A submission whose client will have given up within this long (or a quarter of its
#: timeout, if less) is not served: see `SubmitRequest.timeout_ms`.
STALE_MARGIN_S = 0.5
#: How often the booking keys of departed devices are looked for (`drop_departed`).
DEPARTED_SWEEP_S = 600.0
#: At stop, the last writes (learned corrections, gathered results, deferred releases) get
#: at most this long in all, and none without NATS: each is made good otherwise (corrections
#: are learned again, a replica adopting the pipelines commits results from their events,
#: bookings expire).
FINAL_WRITES_S = 10.0
#: Live task events waiting to be handled at which a new submission waits for them first
#: (EVENTS_CAUGHT_UP), at most EVENTS_WAIT_S. Without it, an orchestrator placing flat out
#: fell further behind its events by the second: releases come from them, so every plan
#: read more booked windows, and the watchdog took tasks long done for stalled.
EVENTS_BEHIND = 512
EVENTS_CAUGHT_UP = 64
EVENTS_WAIT_S = 5.0
#: An adopted pipeline waiting for an agent looks at its lease at least this often.
AGENT_WAIT_LOOK_S = 2.0
#: API requests (other than submits, which have their own queue) served at once per replica.
MAX_API_IN_FLIGHT = 256
#: A replica's name is a token of its own subjects (`subjects.replica_*`): an `Ident`.
OWNER_NAME = TypeAdapter(Ident)
M = TypeVar("M", bound=WireModel)


class Orchestrator:
    def __init__(
        self,
        nats_url: str,
        *,
        misses: int = 3,
        lease_s: float = LEASE_S,
        name: str | None = None,
        plan_budget_s: float = PLAN_BUDGET_S,
        owner_lease_s: float = OWNER_LEASE_S,
        stall_s: float = STALL_S,
        keep_s: float = ownership.KEEP_S,
        booking_key_max_bytes: int = KEY_MAX_BYTES,
        max_queued_submits: int = MAX_QUEUED_SUBMITS,
    ) -> None:
        self.nats_url = nats_url
        #: How deep a device's queue of booked windows may grow, as its key's encoded size.
        self.booking_key_max_bytes = booking_key_max_bytes
        #: Pipelines' leases, records, specs and results expire this long after their last
        #: write (an ended pipeline's: after its end).
        self.keep_s = keep_s
        self.watchdog = Watchdog(self, stall_s)
        #: Time the portfolio may spend per plan beyond HEFT (HEFT always runs).
        self.plan_budget_s = plan_budget_s
        self.owner = name or f"orch-{uuid.uuid4().hex[:10]}"
        try:
            OWNER_NAME.validate_python(self.owner)
        except ValidationError:
            raise ValueError(
                f"orchestrator name {self.owner!r}: 1-128 of A-Z a-z 0-9 _ -"
            ) from None
        self.view = ClusterView(misses, salt=self.owner)
        self.pipelines: dict[str, PipelineRun] = {}
        self._trim_at = MAX_PIPELINES_KEPT + TRIM_STEP
        self.nc: NATS | None = None
        self.js: Any = None
        self.store: BookingStore = None  # type: ignore[assignment]  # set in start()
        self._service: Any = None
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Submissions waiting to be served, each with when it arrived (monotonic clock); at
        #: most `max_queued_submits` beyond those the idle workers are about to take.
        self._submit_queue: asyncio.Queue[tuple[float, Request]] = asyncio.Queue()
        self.max_queued_submits = max_queued_submits
        self._idle_workers = 0
        #: `status`, `list`, `cancel` and `agents` requests being served now.
        self._api_in_flight = 0
        #: Submissions not served because their client had given up (`SubmitRequest.timeout_ms`)
        #: or refused because the queue was full.
        self.stale_submissions = 0
        self.refused_submissions = 0
        #: Ids being submitted now: the same id submitted again meanwhile waits for the first.
        self._submitting: dict[str, asyncio.Event] = {}
        self.cluster_changed = asyncio.Event()
        self.lease_s = lease_s
        self.placer = Placer(self)
        #: Pipeline ownership leases, resumable records, adoption (orchestrator/failover.py).
        self.failover = Failover(self, lease_s=owner_lease_s)
        #: Re-plans on late tasks and slowed devices when the gain rule says so (adaptive.py).
        self.adaptive = Adaptive(self)
        #: The other replicas up (a `list` asks each).
        self.replicas = Replicas(self.owner, self._now)
        #: `status`, `list`, `cancel` and `agents`, answered here or passed on (queries.py).
        self.queries = Queries(self)
        #: Failure detection, recovery and exactly-once result commits (orchestrator/recovery.py).
        self.recovery = Recovery(self)
        #: Evicted tasks, lost windows and lost inputs put back (orchestrator/displaced.py).
        self.displaced = Displaced(self)
        #: Execution-time predictor (with this orchestrator's online corrections) and how far
        #: its plans were off, over every finished task.
        self.predictor = Predictor()
        self.prediction_errors = ErrorStats()
        self.history: History | None = None
        self._stopping = asyncio.Event()
        #: The garbage-collection pause logger (`mars.timing` debug), while running.
        self._gc_hook: Callable[[str, dict[str, int]], None] | None = None
        #: Task events queued behind each other give the loop turns (placements first).
        self.event_pacer = Pacer()
        #: Set while the live task events are caught up (EVENTS_CAUGHT_UP or fewer waiting).
        self._events_caught_up = asyncio.Event()
        self._events_caught_up.set()
        #: Submissions that waited for the task events first (a gauge of overload).
        self.held_submissions = 0
        #: Commits to agents, and the looks that make sure they were heard (commits.py).
        self.commits = Commits(self)
        self._events_sub: Subscription | None = None

    def _now(self) -> float:
        return time.monotonic()

    mono = _now

    @staticmethod
    def wall() -> float:
        """The booking clock: reservations are instants all orchestrators compare."""
        return time.time()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        # the compiled planning loop (when numba is installed) loads before the first request
        compiled.warm_up()
        self.nc = await nats.connect(
            self.nats_url,
            name="mars-orchestrator",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            disconnected_cb=self._on_nats_down,
            reconnected_cb=self._on_nats_up,
            error_cb=nats_error_logger(log),
        )
        nc = self.nc
        js = self.js = nc.jetstream()
        self.store = BookingStore(
            js, key_max_bytes=key_limit(self.booking_key_max_bytes, nc.max_payload)
        )
        await self.store.start()
        self.history = History(js, self.predictor.corrections)
        try:
            loaded = await self.history.start()
            log.info("predictor: %d correction tracks loaded", loaded)
            self._spawn(self.history.run(self._stopping))
        except Exception as exc:  # a missing history costs accuracy, not availability
            log.warning("predictor history unavailable: %s", exc)
        await self.failover.start()
        with contextlib.suppress(Exception):
            await js.add_stream(
                StreamConfig(
                    name=subjects.EVENTS_STREAM,
                    subjects=[f"{subjects.EVENTS}.>"],
                    retention=RetentionPolicy.LIMITS,
                    max_age=24 * 3600,
                    max_bytes=256 * 1024 * 1024,
                )
            )
        await self.recovery.start()
        await nc.subscribe(subjects.ALL_ADVERTS, cb=self._on_advert)
        await nc.subscribe(subjects.ALL_HEARTBEATS, cb=self._on_heartbeat)
        self._events_sub = await nc.subscribe(subjects.ALL_TASK_EVENTS, cb=self._on_live_task_event)
        await nc.subscribe(subjects.ALL_EVICTIONS, cb=self.displaced.on_evict)
        await nc.subscribe(subjects.ALL_INPUTS_GONE, cb=self.displaced.on_input_gone)
        await self.queries.subscribe()
        await self.replicas.start(nc)
        svc = await nats.micro.add_service(
            nc,
            name=subjects.API_SERVICE,
            version=VERSION,
            queue_group=subjects.API_QUEUE,
            description="MARS pipeline API",
        )
        endpoints: list[tuple[str, str, Callable[[Request], Awaitable[None]]]] = [
            ("submit", subjects.SUBMIT, self._enqueue_submit),
            ("status", subjects.STATUS, self._ep(StatusRequest, self.queries.status)),
            ("list", subjects.LIST, self._ep(ListRequest, self.queries.list)),
            ("cancel", subjects.CANCEL, self._ep(CancelRequest, self.queries.cancel)),
            ("agents", subjects.AGENTS, self._ep(AgentsRequest, self.queries.agents)),
        ]
        for name, subject, handler in endpoints:
            await svc.add_endpoint(name=name, subject=subject, handler=handler)
        self._service = svc
        for _ in range(SUBMITS_AT_ONCE):
            self._spawn(self._submit_worker())
        await nc.publish(subjects.DISCOVER, b"")
        self._spawn(self._renew_loop())
        self._spawn(self._departed_loop())
        self._spawn(self.commits.confirm_loop())
        self._spawn(self.watchdog.run())
        self._spawn(self.failover.run())
        await self.adaptive.start()
        await settle(nc)  # every subscription is live before a caller's first request
        await self.replicas.announce()
        self._spawn(self.replicas.run())
        if timing_log.isEnabledFor(logging.DEBUG):
            self._gc_hook = eventloop.gc_pause_hook(timing_log)
            gc.callbacks.append(self._gc_hook)
        log.info("orchestrator %s up on %s", self.owner, self.nats_url)

    def idle(self) -> bool:
        """Nothing being submitted, placed or waiting to be: a collection now holds up no
        reply."""
        return not self._submitting and not self.placer.placing and self._submit_queue.empty()

    async def _on_nats_down(self) -> None:
        self.recovery.observer_lost()

    async def _on_nats_up(self) -> None:
        self.recovery.observer_back()
        if self.store is not None:
            self._spawn(self.store.rewatch())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._stopping.is_set():
            task.cancel()  # spawned by a task being stopped: it never starts
        return task

    async def stop(self) -> None:
        self._stopping.set()
        if self._gc_hook is not None and self._gc_hook in gc.callbacks:
            gc.callbacks.remove(self._gc_hook)  # the process may start another orchestrator
        # the last writes get FINAL_WRITES_S in all, none when NATS is out of reach: each
        # would otherwise wait out its own timeout, one after another
        loop = asyncio.get_running_loop()
        reachable = self.nc is not None and self.nc.is_connected
        deadline = loop.time() + (FINAL_WRITES_S if reachable else 0.0)
        if self.history is not None:
            try:  # what was learned since the last write
                if not await eventloop.done_by(deadline, self.history.flush(final=True)):
                    log.warning(
                        "stopping: learned corrections not all written (%s)",
                        "NATS out of reach" if not reachable else f"{FINAL_WRITES_S:.0f} s passed",
                    )  # fmt: skip
            except Exception as exc:
                log.warning("stopping: learned corrections not written: %s", exc)
        while left := [t for t in self._tasks if not t.done()]:  # clean-ups may spawn more
            for t in left:
                t.cancel()
            for t in left:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        if self.recovery.ledger is not None:
            await self.recovery.ledger.stop(deadline)  # results still gathered are written
        if self.store is not None:
            await self.store.stop(deadline)
            st = self.store.stats
            log.info(
                "bookings: %d writes, %d CAS retries, %d conflicts, %d refused for a full key; "
                "releases: %d, of them %d carried by another write, %d written alone",
                st.writes, st.cas_retries, st.conflicts, st.full, st.releases_deferred,
                st.releases_carried, st.releases_flushed,
            )  # fmt: skip
        if self.held_submissions or self.watchdog.skipped:
            log.warning(
                "behind on task events: %d submissions waited for them, %d watchdog looks "
                "skipped", self.held_submissions, self.watchdog.skipped,
            )  # fmt: skip
        if self.watchdog.job_answers:
            log.warning(
                "agents asked about stalled or overdue tasks: %s",
                ", ".join(f"{k} {n}" for k, n in sorted(self.watchdog.job_answers.items())),
            )
        await self.failover.stop()
        self.adaptive.stop()
        await self.replicas.leave()
        if self._service is not None:
            with contextlib.suppress(Exception):
                await self._service.stop()
        while not self._submit_queue.empty():  # not served: said so, not left to time out
            _, req = self._submit_queue.get_nowait()
            await self._refuse(req, "this orchestrator is stopping; submit again")
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.nc = None

    def _ep(
        self, model: type[Any], fn: Callable[[Any], Awaitable[WireModel]]
    ) -> Callable[[Request], Awaitable[None]]:
        """An endpoint handler. nats-py runs one subscription's callbacks one after another,
        so each request is served in a task of its own: one waiting on JetStream (a record
        read while the server comes back) or on another replica (a cancel passed on) held
        every request behind it, each timing out in turn. At most MAX_API_IN_FLIGHT at once;
        one beyond is refused `unavailable`."""

        async def serve(req: Request) -> None:
            try:
                body, headers = await handle(req.data, req.headers, model, fn)
                with contextlib.suppress(Exception):  # the requester may be gone
                    await req.respond(body, headers=headers)
            except asyncio.CancelledError:  # stopping: said, not left to time out
                await self._refuse(req, "this orchestrator is stopping; ask again")
                raise
            finally:
                self._api_in_flight -= 1

        async def endpoint(req: Request) -> None:
            if self._api_in_flight >= MAX_API_IN_FLIGHT:
                n = self._api_in_flight
                await self._refuse(req, f"{n} requests are being served here; try again soon")
                return
            self._api_in_flight += 1
            self._spawn(serve(req))

        return endpoint

    async def _enqueue_submit(self, req: Request) -> None:
        """The submit endpoint: each request is queued with when it arrived, for the
        SUBMITS_AT_ONCE workers (`_submit_worker`); one beyond MAX_QUEUED_SUBMITS is refused
        at once. Queued here rather than in the client library, a request's wait is known."""
        waiting = self._submit_queue.qsize() - self._idle_workers
        if waiting >= self.max_queued_submits:
            self.refused_submissions += 1
            await self._refuse(req, f"{waiting} submissions are waiting here; try again soon")
            return
        self._submit_queue.put_nowait((self._now(), req))

    async def _refuse(self, req: Request, why: str) -> None:
        body, headers = error_reply("unavailable", why, None, encoding_of(req.headers))
        with contextlib.suppress(Exception):  # the requester may be gone
            await req.respond(body, headers=headers)

    async def _submit_worker(self) -> None:
        queue = self._submit_queue
        while True:
            self._idle_workers += 1
            try:
                arrived, req = await queue.get()
            finally:
                self._idle_workers -= 1
            try:
                served = functools.partial(self.submit, arrived=arrived)
                body, headers = await handle(req.data, req.headers, SubmitRequest, served)
                await req.respond(body, headers=headers)
            except Exception as exc:  # the requester times out; the service stays up
                log.warning("could not answer a request on %s: %s", req.subject, exc)

    # -- cluster view ---------------------------------------------------------------------------
    async def _on_advert(self, msg: Msg) -> None:
        try:
            adv = decode(msg.data, AgentAdvert)
        except DecodeError as exc:
            log.debug("dropped bad advert on %s: %s", msg.subject, exc.message)
            return
        if msg.subject != subjects.advert(adv.agent_id):
            log.debug("dropped advert for %s sent on %s", adv.agent_id, msg.subject)
            return
        if self.recovery.is_buried(adv.agent_id, adv.incarnation):
            return  # an incarnation a newer one replaced (a zombie behind a healed partition)
        self.adaptive.advert(adv)
        joined = self.view.on_advert(adv, self._now(), level_of(msg.headers))
        if joined:
            log.info("agent %s joined (%s, %s)", adv.agent_id, adv.site, adv.tier)
        self.recovery.on_advert(adv, self._now(), joined)
        self.cluster_changed.set()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            hb = decode(msg.data, Heartbeat)
        except DecodeError:
            return
        if msg.subject == subjects.heartbeat(hb.agent_id):
            self.view.on_heartbeat(hb, self._now())
            self.recovery.on_heartbeat(hb, self._now())

    async def wait_for_agents(self, n: int, timeout: float) -> int:
        """Wait until `n` agents are alive (event-driven); returns how many are."""
        deadline = self._now() + timeout
        while len(self.view.alive(self._now())) < n:
            left = deadline - self._now()
            if left <= 0:
                break
            self.cluster_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.cluster_changed.wait(), left)
        return len(self.view.alive(self._now()))

    # -- events ---------------------------------------------------------------------------------
    async def _on_live_task_event(self, msg: Msg) -> None:
        # every replica hears every task event: those of pipelines it does not hold are left
        # undecoded (a replica adopting a pipeline reads its events from the stream)
        pid = subjects.pipeline_of_task_event(msg.subject)
        if pid is not None and pid in self.pipelines:
            try:
                ev = decode(msg.data, TaskEvent)
            except DecodeError:
                ev = None
            if ev is not None and ev.pipeline_id == pid:  # else: published under another's name
                self.adaptive.task_event(ev)  # lateness timers follow live events, not replays
                await self._task_event(ev)
        if self.events_backlog() <= EVENTS_CAUGHT_UP:
            self._events_caught_up.set()
        await self.event_pacer.pace(self.events_backlog() > 0)

    def events_backlog(self) -> int:
        """Live task events received and not handled yet."""
        sub = self._events_sub
        return sub.pending_msgs if sub is not None else 0

    def events_behind(self) -> bool:
        """EVENTS_BEHIND or more live task events wait: what this replica knows of its tasks
        is that old (new submissions wait, the watchdog does not judge)."""
        return self.events_backlog() >= EVENTS_BEHIND

    async def _catch_up_events(self) -> bool:
        """Backpressure: while behind on task events, a new submission waits for them to be
        handled (placing takes the CPU they need), up to EVENTS_WAIT_S. True if it waited."""
        if not self.events_behind():
            return False
        self.held_submissions += 1
        self._events_caught_up.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._events_caught_up.wait(), EVENTS_WAIT_S)
        return True

    async def _on_task_event(self, msg: Msg) -> None:
        """A task event from a replay of MARS_EVENTS (the live path also lands in
        `_task_event`)."""
        try:
            ev = decode(msg.data, TaskEvent)
        except DecodeError:
            return
        if subjects.pipeline_of_task_event(msg.subject) == ev.pipeline_id:
            await self._task_event(ev)

    async def _task_event(self, ev: TaskEvent) -> None:
        run = self.pipelines.get(ev.pipeline_id)
        if run is None or not self.failover.may_act(run.pipeline_id):
            return  # not ours, or our lease lapsed: fenced (replayed from the stream once back)
        ignored = run.duplicate_events + run.stale_events
        new_state = run.apply(ev, self._now())
        if ev.state in TASK_ENDED_STATES and new_state is None:
            self._give_back_later(run, ev.task_id)
        fresh = run.duplicate_events + run.stale_events == ignored
        await self.recovery.after_event(run, ev, fresh)
        if ev.state == "succeeded" and fresh:
            self._learn(run, ev)
            await self.displaced.producer_ended(run, ev.task_id)
            if self.commits.awaited:
                self.commits.look_sooner(run, ev.task_id)
        elif ev.state == "started" and fresh:
            self._spawn(self.displaced.hold_started(run, ev.task_id, ev.token))
        if new_state is not None:
            if new_state == "failed":
                await self._cancel_on_agents(run, run.reason)
            if run.terminal:
                await self._finished(run)  # persisted before anyone hears it ended
            await self._publish_pipeline(run)
        elif ev.state == "succeeded":
            self.failover.progress(run)  # a finished task: what a new owner resumes from
        async with self._changed:
            self._changed.notify_all()

    def _learn(self, run: PipelineRun, ev: TaskEvent) -> None:
        """Feed a measured duration to the predictor; its track is persisted off this path."""
        tr = run.tasks[ev.task_id]
        if ev.duration_s is None or ev.duration_s <= 0.0:
            return
        if tr.predicted_s is not None:
            self.prediction_errors.add(tr.predicted_s, ev.duration_s)
        key = f"{ev.agent_id}:{ev.device_id}"
        try:
            _, spec = self.view.device_spec(key)
        except KeyError:
            return  # the agent left; its device's figures are gone with it
        changed = self.predictor.observe(
            run.spec_by_id[ev.task_id], key, spec, ev.duration_s, self.wall(), base_s=tr.base_s
        )
        if changed is not None and self.history is not None:
            self.history.mark(*changed)  # written by the history loop, once per window

    async def _publish_pipeline(self, run: PipelineRun, recorded: bool = True) -> None:
        """Tell a pipeline's state; an end only once its record says so (`recorded`: wait
        for that), or a replica answering `status` from the record would still say running."""
        assert self.nc is not None
        if recorded and run.terminal and not self.failover.end_recorded(run.pipeline_id):
            self.failover.tell_when_recorded(run)
            return
        ev = PipelineEvent(
            pipeline_id=run.pipeline_id,
            state=run.state,
            reason=run.reason[:2048],
            at_s=max(0.0, self._now() - run.submitted_at),
        )
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.pipeline_event(run.pipeline_id), encode(ev))

    # -- API ------------------------------------------------------------------------------------
    async def _check_fresh(self, req: SubmitRequest, arrived: float | None) -> None:
        """Refuse to serve a submission whose client has given up on it, or will have before
        it can be answered (`SubmitRequest.timeout_ms`, counted from its arrival here)."""
        if arrived is None or req.timeout_ms is None:
            return
        timeout = req.timeout_ms / 1e3
        waited = self._now() - arrived
        if waited < timeout - min(STALE_MARGIN_S, timeout / 4):
            return
        self.stale_submissions += 1
        async with self._changed:
            self._changed.notify_all()
        log.info(
            "submission %s not served: it waited %.0f ms of its client's %d",
            req.pipeline_id or "(no id)", 1e3 * waited, req.timeout_ms,
        )  # fmt: skip
        raise ServiceError(
            "unavailable",
            f"waited {1e3 * waited:.0f} ms here of the {req.timeout_ms} ms its client waits: "
            "not placed; submit it again (with a pipeline_id, a retry is never placed twice)",
        )

    async def submit(self, req: SubmitRequest, arrived: float | None = None) -> SubmitReply:
        """Serve a submission; `arrived`: when it reached this process (monotonic clock),
        for a request that says how long its client waits."""
        await self._check_fresh(req, arrived)
        pid = req.pipeline_id or uuid.uuid4().hex
        while (first := self._submitting.get(pid)) is not None:
            await first.wait()  # the same id twice at once: answered as the first ended
        self._submitting[pid] = done = asyncio.Event()
        try:
            return await self._submit(req, pid, arrived)
        finally:
            del self._submitting[pid]
            done.set()

    async def _submit(self, req: SubmitRequest, pid: str, arrived: float | None) -> SubmitReply:
        existing = self.pipelines.get(pid)
        if existing is not None:
            if existing.spec != req.pipeline:
                raise ServiceError("conflict", f"pipeline id {pid} exists with another spec")
            return self._submit_reply(existing)
        t_in = time.perf_counter()  # CLOCK_MONOTONIC on Linux: one clock for the whole host
        if await self._catch_up_events():
            await self._check_fresh(req, arrived)  # held back by events for a while: still wanted?
        t0 = time.perf_counter()
        run = PipelineRun(
            pid, req.pipeline, self._now(), submitted_wall=self.wall(), owner=self.owner
        )
        run.state = "placing"
        # The ownership claim goes out first and is awaited only before booking, so its
        # round trip overlaps planning; the run is remembered once the claim is ours.
        claim = asyncio.ensure_future(self._own(run))
        await let_sends_out()
        try:
            return await self._place_new(run, claim, t_in, t0)
        except OwnedElsewhere as other:
            return other.reply  # lost the claim: nothing was booked or offered
        finally:
            await self.failover.spec_saved(pid)  # a write begun is never left behind

    async def place_anew(self, pid: str, spec: PipelineSpec, why: str) -> None:
        """Place a pipeline this replica has just taken over with no record of it (answered
        by a replica that died before recording it), as a new submission under the lease
        already held: `why` goes to its log first, a failure is the pipeline's end (recorded and
        published, as a submission's)."""
        t = time.perf_counter()
        run = PipelineRun(pid, spec, self._now(), submitted_wall=self.wall(), owner=self.owner)
        run.state = "placing"
        run.note(why)
        self._remember(run)
        try:
            await self._place_new(run, None, t, t, anew=True)
        except ServiceError as exc:
            log.warning("pipeline %s, placed anew, not placed: %s", pid, exc.message)

    async def _place_once_an_agent_is_up(self, run: PipelineRun) -> None:
        """An adopted pipeline placed anew while no agent was up waits, its lease renewed,
        until one is (or it is cancelled, or lost to another replica), then is placed anew."""
        pid = run.pipeline_id
        log.info("pipeline %s adopted with no agent up: placed anew once one is", pid)
        while True:
            self.cluster_changed.clear()  # before looking: an advert from now on wakes us
            if self.pipelines.get(pid) is not run or run.terminal or not self.failover.holds(pid):
                return
            if self.failover.may_act(pid) and self.view.alive(self._now()):
                break
            with contextlib.suppress(TimeoutError):  # the lease is looked at again meanwhile
                await asyncio.wait_for(self.cluster_changed.wait(), AGENT_WAIT_LOOK_S)
        await self.place_anew(pid, run.spec, "an agent is up: placed anew")

    async def _place_new(
        self,
        run: PipelineRun,
        claim: asyncio.Future[None] | None,
        t_in: float,
        t0: float,
        anew: bool = False,
    ) -> SubmitReply:
        """Plan, book, offer and commit a new pipeline (`claim`: its ownership claim, awaited
        before anything is booked; None: its lease is held already) and answer for it.
        `anew`: a replica that died placed it before: each of its tasks is placed as moving
        (the windows booked for it then are dropped from every key its new plan writes, and
        not in its way), and offered under a token (replacing what is queued for it)."""
        pid = run.pipeline_id
        try:
            await self.placer.place(run, only=set(run.tasks) if anew else None, gate=claim)
            failed: PlacementFailed | None = None
        except PlacementFailed as exc:
            failed = exc
        except BaseException as exc:
            if claim is not None and not claim.done():
                claim.cancel()
                with contextlib.suppress(BaseException):
                    await claim
            if isinstance(exc, Exception) and self.pipelines.get(pid) is run:
                await self._abandon(run, anew, exc)
                raise ServiceError(
                    "unavailable",
                    f"placing {pid} failed part-way ({type(exc).__name__}: {exc}); nothing of "
                    "it was kept: submit it again",
                ) from exc
            raise
        if claim is not None:
            await claim  # a plan can fail before the gate: whose pipeline is it?
        if failed is not None:
            cause = failed.__cause__
            unsched = isinstance(cause, Unschedulable)
            if (
                isinstance(cause, Unschedulable)
                and cause.no_devices
                and (anew or claim is not None)
            ):
                # no agent up when it was planned (a site restarting, a fleet not back yet;
                # judged by what the plan saw: one may be back by now): not this pipeline's
                # fault. A new one's id is left free for a retry (refused as unschedulable, it
                # was ended, and every resubmit answered with that end); one adopted is left
                # where it is, under the lease held, and placed anew once an agent is up (ended,
                # its client was told it failed for the outage; let go, it was adopted again
                # every few seconds, a warning each time, until one was)
                if anew:  # (its adopter gives back what the dead owner booked for it)
                    await self.placer.withdrawn(pid)  # before the next placement's offers
                    run.note("no agent is up: placed anew once one is")
                    self._spawn(self._place_once_an_agent_is_up(run))
                    async with self._changed:
                        self._changed.notify_all()
                    return self._submit_reply(run)
                await self._abandon(run, False, failed)
                raise ServiceError(
                    "unavailable",
                    "no agent is up: nothing was placed, and the pipeline id is free; "
                    "submit it again once agents are back",
                ) from failed
            # a pipeline that does not fit the fleet is the submitter's news (info); one lost
            # to conflicts or rejections round after round is the operator's (warning)
            log.log(
                logging.INFO if unsched else logging.WARNING,
                "pipeline %s not placed: %s (%s)", pid, failed,
                "; ".join(f"{k}: {v}" for k, v in list(failed.details.items())[:8]),
            )  # fmt: skip
            run.finish("unschedulable" if unsched else "failed", str(failed), self._now())
            await self._finished(run)
            await self._publish_pipeline(run)
            raise ServiceError(
                "unschedulable" if unsched else "conflict", str(failed)[:2048], failed.details
            ) from failed
        if not anew and not await self.failover.spec_written(run):
            # answered without its spec on the bucket, it could be adopted as never answered
            # (no spec, no record yet) and its id freed while its client waits for its end
            # (JetStream is slow for a few seconds after a server restart): not committed,
            # what it booked and was offered goes back, and its client asks again
            unwritten = ServiceError(
                "unavailable",
                f"placing {pid}: its spec could not be written; nothing of it was kept: "
                "submit it again",
            )
            await self.cancel_tasks(
                run, dict(run.placements), "its spec could not be written",
                max_token=max((tr.token for tr in run.tasks.values()), default=0),
            )  # fmt: skip
            await self._abandon(run, False, unwritten)
            raise unwritten
        run.committed_at = self._now()
        run.state = "running"
        # The plan is committed once booked and accepted: starting the tasks (the commit
        # messages, looked after until each agent shows it has them) and the record are off
        # the reply's path, and begin once the reply is written (tasks spawned now would run
        # before it).
        self._spawn(_after_reply(self.commits.commit_all(run, set(run.tasks), unanswered=True)))
        await self._publish_pipeline(run)
        self._spawn(_after_reply(self.persist(run)))  # status falls back to memory meanwhile
        # (its spec is on the bucket before anyone is told of it, above: begun with the claim,
        # long written by now; an adopter that finds no record places it anew)
        reply = self._submit_reply(run)
        if timing_log.isEnabledFor(logging.DEBUG):
            st = run.step_s
            timing_log.debug(
                TIMING_LINE, pid,
                1e3 * st.get("claim", 0.0), 1e3 * st.get("plan", 0.0), 1e3 * st.get("send", 0.0),
                1e3 * st.get("book", 0.0), 1e3 * st.get("offer", 0.0),
                1e3 * (time.perf_counter() - t0), 1e3 * st.get("budget", 0.0), run.conflicts,
                run.rejections, 1e3 * (t0 - t_in), t_in,
            )  # fmt: skip
        return reply

    async def _abandon(self, run: PipelineRun, anew: bool, why: Exception) -> None:
        """A placement given up, not failed: NATS or JetStream went away mid-booking (`why`
        any exception), or no agent was up for a new submission (`why` a PlacementFailed;
        an adopted one waits for an agent instead). Not left "placing" for
        ever (its lease renewed, every resubmit answered with it): what it booked goes back
        (or expires, renewed no more), agents drop what they were offered (never committed,
        its status unknown). A new submission frees its id: its client is told `unavailable`
        and submits again. One placed anew (its client answered long ago) is let go
        unrecorded: its lease lapses and a replica adopts it, placing it anew."""
        pid = run.pipeline_id
        level = logging.INFO if isinstance(why, PlacementFailed) else logging.WARNING
        log.log(level, "placing %s given up (%r): nothing of it kept", pid, why)
        # Out of sight before anything is awaited: a resubmit given to another replica asks
        # the lease's holder, which answered from this run while it was given up ("placing"),
        # and its client waited for an end that never came (booking_stress seeds 515, 516)
        self.pipelines.pop(pid, None)
        await self.placer.withdrawn(pid)  # before a resubmit's offers, which it would withdraw
        self.failover.give_back_strays(pid, keep=())
        if anew:
            self.failover.let_go(pid)
        else:
            with contextlib.suppress(Exception):
                await self.failover.forget_unplaced(pid)
        async with self._changed:
            self._changed.notify_all()

    async def _own(self, run: PipelineRun) -> None:
        """Claim a new pipeline's ownership lease and remember the run; OwnedElsewhere when
        another replica holds it (carrying that replica's answer)."""
        elsewhere = await self.failover.claim(run.pipeline_id, run.spec)
        if elsewhere is not None:
            raise OwnedElsewhere(elsewhere)
        self.failover.save_spec(run)
        self._remember(run)

    async def submit_spec(self, spec: PipelineSpec, pipeline_id: str | None = None) -> SubmitReply:
        """In-process submit (tests, tools): the same path as the API."""
        return await self.submit(SubmitRequest(pipeline=spec, pipeline_id=pipeline_id))

    async def status_of(self, pipeline_id: str) -> StatusReply:
        return await self.queries.status(StatusRequest(pipeline_id=pipeline_id))

    def _submit_reply(self, run: PipelineRun) -> SubmitReply:
        return SubmitReply(
            pipeline_id=run.pipeline_id,
            state=run.state,
            algorithm=run.algorithm,
            makespan_s=run.planned_makespan_s,
            plan=run.plan,
        )

    def _remember(self, run: PipelineRun) -> None:
        self.pipelines[run.pipeline_id] = run
        if len(self.pipelines) > self._trim_at:
            # in steps, not on every submission: finding the finished ones visits them all.
            # One whose end is not recorded yet stays (its lease lapsed as it ended: the end
            # is written once the lease is renewed, from this run; dropped, the lease was
            # renewed for ever over a record saying running, and the pipeline never ended)
            held = self.failover.holds
            for pid in [p for p, r in self.pipelines.items() if r.terminal and not held(p)][
                : len(self.pipelines) - MAX_PIPELINES_KEPT
            ]:
                del self.pipelines[pid]
            self._trim_at = max(len(self.pipelines), MAX_PIPELINES_KEPT) + TRIM_STEP

    def wire_of(self, agent_id: str) -> int:
        """The wire level an agent reads (its adverts'; 1 for one not heard)."""
        entry = self.view.agents.get(agent_id)
        return entry.wire if entry is not None else 1

    async def ask_agent(
        self, subject_of: Callable[[str], str], agent_id: str, msg: WireModel,
        reply_model: type[M], *, timeout: float, encoding: Encoding = "msgpack",
    ) -> M:  # fmt: skip
        """A request to one agent, written at the wire level it reads. Every message this
        process sends to an agent goes through here or `tell_agent`, so none can forget the
        level (tests/unit/test_agent_sends.py holds the package to that)."""
        assert self.nc is not None
        return await request(
            self.nc, subject_of(agent_id), msg, reply_model,
            timeout=timeout, encoding=encoding, level=self.wire_of(agent_id),
        )  # fmt: skip

    async def tell_agent(
        self, subject_of: Callable[[str], str], agent_id: str, msg: WireModel,
        *, encoding: Encoding = "msgpack",
    ) -> None:  # fmt: skip
        """A plain message to one agent, at the wire level it reads (see `ask_agent`)."""
        assert self.nc is not None
        await self.nc.publish(
            subject_of(agent_id), encode(msg, encoding, self.wire_of(agent_id)),
            headers=headers_for(encoding),
        )  # fmt: skip

    async def offer(self, offer: TaskOffer) -> OfferReply:
        assert self.nc is not None
        try:
            return await self.ask_agent(
                subjects.offer, offer.agent_id, offer, OfferReply,
                timeout=OFFER_TIMEOUT_S, encoding=AGENT_ENCODING,
            )  # fmt: skip
        except (TimeoutError, nats.errors.NoRespondersError, RemoteError) as exc:
            return _unanswered(offer, f"no answer to offer: {type(exc).__name__} {exc}"[:2048])

    async def offer_many(self, offers: Sequence[TaskOffer]) -> list[OfferReply]:
        """Offer each task to its agent, one `OfferBatch` request per agent; replies in the
        order of `offers`. An agent that does not serve batches (an older version) gets its
        offers one by one; one that does not answer rejects them all as `unhealthy`."""
        return await self.start_offers(offers)

    def start_offers(self, offers: Sequence[TaskOffer]) -> asyncio.Future[list[OfferReply]]:
        """`offer_many`, its requests under way (a task per agent) when this returns: they
        are written at the loop's next turn or two, not after a task that starts them."""
        per_agent: dict[str, list[int]] = {}
        for i, x in enumerate(offers):
            per_agent.setdefault(x.agent_id, []).append(i)
        out: list[OfferReply | None] = [None] * len(offers)

        async def one_agent(agent_id: str, idx: list[int]) -> None:
            mine = [offers[i] for i in idx]
            if len(mine) == 1:
                out[idx[0]] = await self.offer(mine[0])
                return
            assert self.nc is not None
            try:
                rep = await self.ask_agent(
                    subjects.offers, agent_id, OfferBatch(offers=mine), OfferBatchReply,
                    timeout=OFFER_TIMEOUT_S, encoding=AGENT_ENCODING,
                )  # fmt: skip
                replies: list[OfferReply] = rep.replies
            except nats.errors.NoRespondersError:
                replies = list(await asyncio.gather(*(self.offer(x) for x in mine)))
            except (TimeoutError, RemoteError) as exc:
                why = f"no answer to offers: {type(exc).__name__} {exc}"[:2048]
                replies = [_unanswered(x, why) for x in mine]
            for i, x in zip(idx, mine, strict=True):
                got = next((r for r in replies if r.task_id == x.task.id), None)
                out[i] = got if got is not None else _unanswered(x, "no reply for this offer")

        asked = asyncio.gather(*(one_agent(a, idx) for a, idx in per_agent.items()))

        async def answers() -> list[OfferReply]:
            await asked
            return [
                r if r is not None else _unanswered(x, "not offered")
                for r, x in zip(out, offers, strict=True)
            ]

        return asyncio.ensure_future(answers())

    async def cancel_tasks(
        self,
        run: PipelineRun,
        where: dict[str, Placement],
        reason: str,
        max_token: int | None = None,
    ) -> None:
        """Withdraw these tasks from the agents that accepted them (with `max_token`: only
        placements made under at most that token, never one that followed)."""
        assert self.nc is not None
        per_agent: dict[str, list[str]] = {}
        for tid, p in where.items():
            per_agent.setdefault(p.device_id.split(":", 1)[0], []).append(tid)
        for agent_id, tids in per_agent.items():
            cmd = CancelCommand(
                pipeline_id=run.pipeline_id, reason=reason[:2048], task_ids=sorted(tids),
                max_token=max_token,
            )  # fmt: skip
            with contextlib.suppress(Exception):
                await self.tell_agent(subjects.cancel, agent_id, cmd)

    def _give_back_later(self, run: PipelineRun, task_id: str) -> None:
        """A task ended while its pipeline runs on: its window would otherwise hold its device
        until the pipeline ends (a window whose end has passed counts as work still queued or
        running: `planning.with_bookings`), long after the work is done. Planning here sees it
        gone at once; the bucket with the key's next write (`BookingStore.defer_release`)."""
        tr = run.tasks[task_id]
        booked = run.windows.get(task_id)
        if booked is None or tr.state not in TASK_ENDED_STATES:
            return  # an event of a superseded placement changes nothing here
        if run.terminal or not self.failover.may_act(run.pipeline_id):
            return  # one that ended gives everything back; one not ours is not ours to give
        key, start, end = booked
        self.store.defer_release(key, run.pipeline_id, self.wall(), exact=[(task_id, start, end)])

    async def _finished(self, run: PipelineRun) -> None:
        """A terminal pipeline gives its reservations back at once (written with each key's
        next booking, or alone soon after: `BookingStore.defer_release`)."""
        now = self.wall()
        # where its tasks are, and every window this replica booked for it (a re-placement
        # under way may have booked one its placements do not show yet)
        keys = {device_key_of(d) for d in run.devices()} | {k for k, _, _ in run.windows.values()}
        for key in sorted(keys):
            self.store.defer_release(key, run.pipeline_id, now)
        self.displaced.forget(run.pipeline_id)
        await self.persist(run)
        run.settled = True
        async with self._changed:
            self._changed.notify_all()

    async def persist(self, run: PipelineRun) -> None:
        """Pipeline state in KV, so any replica can answer `status` for it, and the record a
        replica adopting it resumes from (fenced by the ownership lease)."""
        await self.failover.persist(run)

    async def _departed_loop(self) -> None:
        while True:
            await asyncio.sleep(DEPARTED_SWEEP_S)  # a sweep's cadence, not synchronisation
            try:
                await self.drop_departed()
            except Exception as exc:
                log.warning("dropping departed devices' booking keys failed: %s", exc)

    async def drop_departed(self) -> int:
        """Delete the booking keys of devices no live agent has whose windows have all
        expired: with agents that come and go under new ids, the bucket (and every replica's
        copy, loaded whole at its start) would otherwise keep one key per device ever seen."""
        now = self._now()
        live = {
            f"{e.advert.agent_id}:{d.device_id}" for e in self.view.alive(now)
            for d in e.advert.devices
        }  # fmt: skip
        stale = self.store.stale_keys(self.wall(), live)
        if not stale:
            return 0
        dropped = await self.store.drop(stale)
        if dropped:
            log.info("dropped %d booking keys of departed devices", dropped)
        return dropped

    async def _renew_loop(self) -> None:
        """Extend our live pipelines' reservations; a dead orchestrator stops doing this and
        its windows expire."""
        while True:
            await asyncio.sleep(self.lease_s / 3)  # renewal cadence, not synchronisation
            await self.renew_all()
            await self.displaced.audit_windows()

    async def renew_all(self) -> None:
        """One renewal of every live pipeline's windows, one write per key. Finding the keys
        gives the loop a turn after every RENEW_SLICE_TASKS placements read (5,000 live
        pipelines of 20 tasks held it ~10 ms in one pass)."""
        now = self.wall()
        by_key: dict[str, set[str]] = {}
        read = 0
        for run in list(self.pipelines.values()):
            if read >= RENEW_SLICE_TASKS:
                await asyncio.sleep(0)
                read = 0
            if run.terminal:
                continue
            read += len(run.placements)
            for d in run.devices():
                by_key.setdefault(device_key_of(d), set()).add(run.pipeline_id)
        for key, pids in by_key.items():
            try:
                await self.store.renew(key, pids, now + self.lease_s, now)
            except Exception as exc:
                log.warning("renewing %s failed: %s", key, exc)

    async def _cancel_on_agents(self, run: PipelineRun, reason: str) -> None:
        assert self.nc is not None
        cmd = CancelCommand(pipeline_id=run.pipeline_id, reason=reason[:2048])
        agents = sorted({tr.agent_id for tr in run.tasks.values() if tr.agent_id})
        for a in agents:
            with contextlib.suppress(Exception):
                await self.tell_agent(subjects.cancel, a, cmd)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """In-process wait until `predicate` holds (re-checked on every pipeline change)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def wait_terminal(self, pipeline_id: str, timeout: float) -> PipelineRun:
        """In-process wait (used by tests and the demo)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(
                lambda: pipeline_id in self.pipelines and self.pipelines[pipeline_id].settled
            )
        return self.pipelines[pipeline_id]


async def _after_reply(work: Coroutine[Any, Any, None]) -> None:
    """`work`, once the reply being sent now is on the wire: nats-py writes it at the loop's
    next turn, after whatever was scheduled before it."""
    try:
        await let_sends_out()
    except BaseException:
        work.close()  # stopped first: never started, and never left unawaited
        raise
    await work


class OwnedElsewhere(Exception):
    """A submitted pipeline id is owned by another replica: answer with its reply."""

    def __init__(self, reply: SubmitReply) -> None:
        super().__init__(f"pipeline {reply.pipeline_id} is owned elsewhere")
        self.reply = reply


def _unanswered(offer: TaskOffer, reason: str) -> OfferReply:
    return OfferReply(
        pipeline_id=offer.pipeline_id,
        task_id=offer.task.id,
        agent_id=offer.agent_id,
        accepted=False,
        code="unhealthy",
        reason=reason,
    )


async def run_orchestrator(
    nats_url: str,
    stop: asyncio.Event | None = None,
    name: str | None = None,
    plan_budget_s: float = PLAN_BUDGET_S,
    started: asyncio.Event | None = None,
    keep_s: float = ownership.KEEP_S,
    booking_key_max_bytes: int = KEY_MAX_BYTES,
) -> None:
    """The orchestrator of a process of its own (`mars orchestrator`): its garbage collector
    is paced (`eventloop.PacedGc`), collections waiting for a moment with no submission
    under way. `started` is set once it serves."""
    orch = Orchestrator(
        nats_url, name=name, plan_budget_s=plan_budget_s, keep_s=keep_s,
        booking_key_max_bytes=booking_key_max_bytes,
    )  # fmt: skip
    await orch.start()
    pacer = eventloop.PacedGc(orch.idle)
    pacer.start()
    paced = asyncio.create_task(pacer.run())
    if started is not None:
        started.set()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        try:
            await orch.stop()
        finally:
            paced.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await paced
            pacer.stop()
