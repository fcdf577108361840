"""The orchestrator's asyncio shell: cluster view, API service, dispatch and event tracking."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
import uuid
from collections.abc import (
    Awaitable,
    Callable,
    Sequence,
)
from typing import Any, TypeVar

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import RetentionPolicy, StreamConfig
from nats.micro.request import Request
from nats.micro.service import Service, ServiceConfig
from pydantic import TypeAdapter, ValidationError

from orchestrator.api.queries import Queries
from orchestrator.api.submissions import (
    MAX_QUEUED_SUBMITS,
    SUBMITS_AT_ONCE,
    Submissions,
    after_reply,
    refuse,
    timing_log,
)
from orchestrator.api.users import UserQueries, for_user
from orchestrator.infra import buckets, eventloop
from orchestrator.infra.coalesce import Coalescer
from orchestrator.infra.eventloop import Pacer
from orchestrator.infra.kvwatch import all_keys
from orchestrator.placement.commits import AGENT_ENCODING, OFFER_TIMEOUT_S, Commits
from orchestrator.placement.placer import Placer
from orchestrator.placement.planning import PLAN_BUDGET_S
from orchestrator.placement.registry import ClusterView
from orchestrator.placement.store_reads import StoreLookup
from orchestrator.predictor.history import History
from orchestrator.predictor.model import ErrorStats, Predictor
from orchestrator.reliability import ownership
from orchestrator.reliability.adaptive import Adaptive
from orchestrator.reliability.displaced import Displaced
from orchestrator.reliability.failover import OWNER_LEASE_S, Failover
from orchestrator.reliability.recovery import Recovery
from orchestrator.reliability.replicas import Replicas
from orchestrator.reliability.watchdog import STALL_S, Watchdog
from orchestrator.reservations.store import (
    KEY_MAX_BYTES,
    BookingStore,
    device_key_of,
    key_limit,
)
from orchestrator.scheduling import Placement, calibration, compiled
from orchestrator.state import lifecycle
from orchestrator.state.pipelines import PipelineRun
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
    RemoteError,
    decode,
    encode,
    headers_for,
)
from schemas.events import PipelineEvent, TaskEvent
from schemas.limits import Ident
from schemas.pipeline import PipelineSpec
from schemas.placement import (
    MAX_BATCH,
    CancelCommand,
    OfferBatch,
    OfferBatchReply,
    OfferReply,
    TaskOffer,
)
from schemas.wire import SENDER_SUBJECTS, level_of
from transport import connect
from transport.rpc import handle, nats_error_logger, request, settle

log = logging.getLogger("mars.orchestrator")
#: A heartbeat's subject is HEAD<agent id>TAIL (`subjects.heartbeat`); a real one is < 200 bytes.
HEARTBEAT_HEAD, HEARTBEAT_TAIL = subjects.heartbeat("\0").split("\0")
MAX_HEARTBEAT_BYTES = 1024
#: Shortest time between two adverts of one agent that are both applied (a burst's latest
#: is applied at the end of it): an agent's legitimate adverts are seconds apart.
ADVERT_GAP_S = 0.1
#: `run_orchestrator(retry_start=True)`: the first wait after a failed start, and the longest.
START_RETRY_FIRST_S = 0.5
START_RETRY_MAX_S = 30.0
VERSION = "0.1.0"
#: Reservations expire this long after their last renewal.
LEASE_S = 15.0
#: A renewal gives the event loop a turn after reading about this many placements.
RENEW_SLICE_TASKS = 2000
#: Finished pipelines kept in memory (`list` shows the live ones and these; `status` of any
#: other is rebuilt from its record in KV). Every object kept is visited by each full garbage
#: collection, which stops the orchestrator, and the young ones by each young collection
#: too: every pipeline kept lengthens those pauses, so only a few are.
MAX_PIPELINES_KEPT = 16
#: ... trimmed back to that many each time this many more have come in.
TRIM_STEP = 16
#: How often the booking keys of departed devices are looked for (`drop_departed`).
DEPARTED_SWEEP_S = 600.0
#: At stop, the last writes (learned corrections, gathered results, deferred releases) get
#: at most this long in all, and none without NATS: each is made good otherwise (corrections
#: are learned again, a replica adopting the pipelines commits results from their events,
#: bookings expire).
FINAL_WRITES_S = 10.0
#: How long stopping waits for its spawned tasks to end once cancelled.
STOP_TASKS_S = 5.0
#: Live task events waiting to be handled at which a new submission waits for them first
#: (EVENTS_CAUGHT_UP), at most EVENTS_WAIT_S. Without it, an orchestrator placing flat out
#: fell further behind its events by the second: releases come from them, so every plan
#: read more booked windows, and the watchdog took tasks long done for stalled.
EVENTS_BEHIND = 512
EVENTS_CAUGHT_UP = 64
EVENTS_WAIT_S = 5.0
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
        self.stored: StoreLookup = None  # type: ignore[assignment]  # set in start()
        self.store: BookingStore = None  # type: ignore[assignment]  # set in start()
        self._service: Any = None
        self.changed = asyncio.Condition()
        self._tasks: set[asyncio.Task[None]] = set()
        #: The submit endpoint's queue and workers, and new pipelines' placement.
        self.submissions = Submissions(self, max_queued_submits)
        #: `status`, `list`, `cancel` and `agents` requests being served now.
        self._api_in_flight = 0
        self.cluster_changed = asyncio.Event()
        self.lease_s = lease_s
        self.placer = Placer(self)
        #: Pipeline ownership leases, resumable records, adoption (reliability/failover.py).
        self.failover = Failover(self, lease_s=owner_lease_s)
        #: Re-plans on late tasks and slowed devices when the gain rule says so (adaptive.py).
        self.adaptive = Adaptive(self)
        #: The other replicas up (a `list` asks each).
        self.replicas = Replicas(self.owner, self.mono)
        #: `status`, `list`, `cancel` and `agents`, answered here or passed on (queries.py).
        self.queries = Queries(self)
        #: Failure detection, recovery and exactly-once result commits (reliability/recovery.py).
        self.recovery = Recovery(self)
        #: Evicted tasks, lost windows and lost inputs put back (reliability/displaced.py).
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
        self.events_caught_up = asyncio.Event()
        self.events_caught_up.set()
        #: Submissions that waited for the task events first (a gauge of overload).
        self.held_submissions = 0
        #: Task events dropped because their subject names another agent than their payload
        #: (or, from an agent that names itself, none): one agent speaking for another.
        self.misnamed_events = 0
        #: Commits to agents, and the looks that make sure they were heard (commits.py).
        self.commits = Commits(self)
        #: Adverts applied at most once per ADVERT_GAP_S per agent, the latest winning.
        self._adverts: Coalescer[Msg] = Coalescer(
            self._apply_advert, ADVERT_GAP_S, self.mono, self.spawn
        )
        self._events_sub: Subscription | None = None

    def mono(self) -> float:
        """The run clock: deadlines and ages within this process."""
        return time.monotonic()

    @staticmethod
    def wall() -> float:
        """The booking clock: reservations are instants all orchestrators compare."""
        return time.time()

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        # the compiled planning loop (when numba is installed) loads before the first request
        compiled.warm_up()
        # and the portfolio's measures of this process's loops, which a first plan would pay
        calibration.loop_scale()
        calibration.wide_scale()
        self.nc = await nats.connect(
            connect.servers(self.nats_url),
            # the order given: a replica's own hub node first (`mars deploy`), the rest after
            dont_randomize=True,
            name="mars-orchestrator",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            disconnected_cb=self._on_nats_down,
            reconnected_cb=self._on_nats_up,
            error_cb=nats_error_logger(log),
            **connect.options(),
        )
        nc = self.nc
        js = self.js = connect.jetstream(nc)
        self.stored = StoreLookup(js, self.predictor.book)
        self.store = BookingStore(
            js, key_max_bytes=key_limit(self.booking_key_max_bytes, nc.max_payload)
        )
        await self.store.start()
        self.history = History(js, self.predictor.corrections, list_keys=all_keys)
        try:
            loaded = await self.history.start()
            log.info("predictor: %d correction tracks loaded", loaded)
            self.spawn(self.history.run(self._stopping))
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
                    num_replicas=connect.js_replicas(),
                )
            )
        if connect.Credentials.from_env().secure:
            # agents and users may not create streams there: the control plane makes them
            await buckets.ensure(js)
        await self.recovery.start()
        await nc.subscribe(subjects.ALL_ADVERTS, cb=self._on_advert)
        await nc.subscribe(subjects.ALL_HEARTBEATS, cb=self._on_heartbeat)
        self._events_sub = await nc.subscribe(subjects.ALL_TASK_EVENTS, cb=self.on_live_task_event)
        await nc.subscribe(subjects.ALL_EVICTIONS, cb=self.displaced.on_evict)
        await nc.subscribe(subjects.ALL_INPUTS_GONE, cb=self.displaced.on_input_gone)
        await self.queries.subscribe()
        await self.replicas.start(nc)
        svc = Service(
            nc,
            ServiceConfig(
                name=subjects.API_SERVICE,
                version=VERSION,
                queue_group=subjects.API_QUEUE,
                description="MARS pipeline API",
            ),
        )
        endpoints: list[tuple[str, str, Callable[[Request], Awaitable[None]]]] = [
            ("submit", subjects.SUBMIT, self.submissions.enqueue),
            ("status", subjects.STATUS, self._ep(StatusRequest, self.queries.status)),
            ("list", subjects.LIST, self._ep(ListRequest, self.queries.list)),
            ("cancel", subjects.CANCEL, self._ep(CancelRequest, self.queries.cancel)),
            ("agents", subjects.AGENTS, self._ep(AgentsRequest, self.queries.agents)),
        ]
        # the same, as one user asks it: `<subject>.<user>` (orchestrator/api/users.py)
        mine = UserQueries(self, self.queries)
        endpoints += [
            ("submit-user", subjects.api_users(subjects.SUBMIT), self.submissions.enqueue),
            *(
                (f"{name}-user", subjects.api_users(subject), self._ep(model, fn, per_user=True))
                for name, subject, model, fn in (
                    ("status", subjects.STATUS, StatusRequest, mine.status),
                    ("list", subjects.LIST, ListRequest, mine.list),
                    ("cancel", subjects.CANCEL, CancelRequest, mine.cancel),
                    ("agents", subjects.AGENTS, AgentsRequest, mine.agents),
                )
            ),
        ]
        for name, subject, handler in endpoints:
            await svc.add_endpoint(name=name, subject=subject, handler=handler)
        # visible ($SRV PING, INFO, STATS) only now: `nats.micro.add_service` answers them
        # before its endpoints are added, so a client discovering the API as it came up saw
        # none (the server takes one connection's subscriptions in the order they are sent)
        await svc.start()
        self._service = svc
        for _ in range(SUBMITS_AT_ONCE):
            self.spawn(self.submissions.worker())
        await nc.publish(subjects.DISCOVER, b"")
        self.spawn(self._renew_loop())
        self.spawn(self._departed_loop())
        self.spawn(self.commits.confirm_loop())
        self.spawn(self.watchdog.run())
        self.spawn(self.failover.run())
        await self.adaptive.start()
        await settle(nc)  # every subscription is live before a caller's first request
        await self.replicas.announce()
        self.spawn(self.replicas.run())
        if timing_log.isEnabledFor(logging.DEBUG):
            self._gc_hook = eventloop.gc_pause_hook(timing_log)
            gc.callbacks.append(self._gc_hook)
        log.info("orchestrator %s up on %s", self.owner, self.nats_url)

    def idle(self) -> bool:
        """Nothing being submitted, placed or waiting to be: a collection now holds up no
        reply."""
        subs = self.submissions
        return not subs.submitting and not self.placer.placing and subs.queue.empty()

    async def _on_nats_down(self) -> None:
        self.recovery.observer_lost()

    async def _on_nats_up(self) -> None:
        self.recovery.observer_back()
        if self.store is not None:
            self.spawn(self.store.rewatch())

    async def notify_changed(self) -> None:
        """Wake whoever waits on a pipeline's state (`wait_for`, `wait_terminal`)."""
        async with self.changed:
            self.changed.notify_all()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
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
        await self._cancel_spawned(STOP_TASKS_S)
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
        while not self.submissions.queue.empty():  # not served: said so, not left to time out
            _, req = self.submissions.queue.get_nowait()
            await refuse(req, "this orchestrator is stopping; submit again")
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.nc = None

    async def _cancel_spawned(self, within_s: float) -> None:
        """Cancel what this service spawned, and what those spawn as they end, for at most
        `within_s`: a task that does not end when cancelled (one that swallows it) is named
        in the log and left, not waited on for good."""
        loop = asyncio.get_running_loop()
        until = loop.time() + within_s
        while left := [t for t in self._tasks if not t.done()]:
            for t in left:
                t.cancel()
            done, pending = await asyncio.wait(left, timeout=max(0.0, until - loop.time()))
            for t in done:  # retrieved: an error while stopping is no news
                if not t.cancelled():
                    t.exception()
            if pending:
                names = sorted({getattr(t.get_coro(), "__qualname__", "?") for t in pending})
                log.warning(
                    "stopping: %d tasks did not end %.0f s after being cancelled: %s",
                    len(pending), within_s, ", ".join(names[:10]),
                )  # fmt: skip
                return

    def _ep(
        self, model: type[Any], fn: Callable[..., Awaitable[WireModel]], per_user: bool = False
    ) -> Callable[[Request], Awaitable[None]]:
        """An endpoint handler. nats-py runs one subscription's callbacks one after another,
        so each request is served in a task of its own: one waiting on JetStream (a record
        read while the server comes back) or on another replica (a cancel passed on) held
        every request behind it, each timing out in turn. At most MAX_API_IN_FLIGHT at once;
        one beyond is refused `unavailable`. `per_user`: `fn` also takes the user the
        request's subject names (`users.for_user`)."""

        async def serve(req: Request) -> None:
            try:
                served = for_user(fn, req.subject) if per_user else fn
                body, headers = await handle(req.data, req.headers, model, served)
                with contextlib.suppress(Exception):  # the requester may be gone
                    await req.respond(body, headers=headers)
            except asyncio.CancelledError:  # stopping: said, not left to time out
                await refuse(req, "this orchestrator is stopping; ask again")
                raise
            finally:
                self._api_in_flight -= 1

        async def endpoint(req: Request) -> None:
            if self._api_in_flight >= MAX_API_IN_FLIGHT:
                n = self._api_in_flight
                await refuse(req, f"{n} requests are being served here; try again soon")
                return
            self._api_in_flight += 1
            self.spawn(serve(req))

        return endpoint

    # -- cluster view ---------------------------------------------------------------------------
    async def _on_advert(self, msg: Msg) -> None:
        """At most one advert per agent per ADVERT_GAP_S is decoded, the latest of a burst:
        one identity advertising in a loop costs a dict write per message."""
        sender = msg.subject[len(subjects.PREFIX) + len(".agents.") :].partition(".")[0]
        await self._adverts.offer(sender, msg)

    def advert_stats(self) -> dict[str, int]:
        """Adverts replaced by a later one of the same agent before being read."""
        return {"coalesced": self._adverts.coalesced}

    async def _apply_advert(self, msg: Msg) -> None:
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
        self.commits.heard_from(adv.agent_id)
        self.adaptive.advert(adv)
        joined = self.view.on_advert(adv, self.mono(), level_of(msg.headers))
        if joined:
            log.info("agent %s joined (%s, %s)", adv.agent_id, adv.site, adv.tier)
        self.recovery.on_advert(adv, self.mono(), joined)
        self.cluster_changed.set()

    async def _on_heartbeat(self, msg: Msg) -> None:
        """Every replica hears every agent's heartbeat: what is not a known agent's (its id
        taken from the subject) or is too large for one is dropped before it is decoded."""
        subject = msg.subject
        if not (subject.startswith(HEARTBEAT_HEAD) and subject.endswith(HEARTBEAT_TAIL)):
            return
        agent_id = subject[len(HEARTBEAT_HEAD) : -len(HEARTBEAT_TAIL)]
        if agent_id not in self.view.agents or len(msg.data) > MAX_HEARTBEAT_BYTES:
            return  # unknown: its advert comes first (a heartbeat alone changes nothing)
        # (a full decode is ~3 us of the ~35 us a heartbeat costs here, most of it the
        # client library's own; checking the fields by hand and building the model unchecked
        # measured slower)
        try:
            hb = decode(msg.data, Heartbeat)
        except DecodeError:
            return
        if hb.agent_id == agent_id:
            now = self.mono()
            self.view.on_heartbeat(hb, now)
            self.recovery.on_heartbeat(hb, now)

    async def wait_for_agents(self, n: int, timeout: float) -> int:
        """Wait until `n` agents are alive (event-driven); returns how many are."""
        deadline = self.mono() + timeout
        while len(self.view.alive(self.mono())) < n:
            left = deadline - self.mono()
            if left <= 0:
                break
            self.cluster_changed.clear()
            await eventloop.wait_event(self.cluster_changed, left)
        return len(self.view.alive(self.mono()))

    # -- events ---------------------------------------------------------------------------------
    async def on_live_task_event(self, msg: Msg) -> None:
        """A task event as it is published (the live subscription's handler). Every replica
        hears every one: those of pipelines it does not hold are left undecoded (a replica
        adopting a pipeline reads its events from the stream)."""
        pid = subjects.pipeline_of_task_event(msg.subject)
        if pid is not None and pid in self.pipelines:
            try:
                ev = decode(msg.data, TaskEvent)
            except DecodeError:
                ev = None
            # else: published under another pipeline's name, or another agent's
            if ev is not None and ev.pipeline_id == pid and self.sent_by_its_agent(msg, ev):
                self.adaptive.task_event(ev)  # lateness timers follow live events, not replays
                await self.apply_event(ev)
        if self.events_backlog() <= EVENTS_CAUGHT_UP:
            self.events_caught_up.set()
        await self.event_pacer.pace(self.events_backlog() > 0)

    def events_backlog(self) -> int:
        """Live task events received and not handled yet."""
        sub = self._events_sub
        return sub.pending_msgs if sub is not None else 0

    def events_behind(self) -> bool:
        """EVENTS_BEHIND or more live task events wait: what this replica knows of its tasks
        is that old (new submissions wait, the watchdog does not judge)."""
        return self.events_backlog() >= EVENTS_BEHIND

    async def catch_up_events(self) -> bool:
        """Backpressure: while behind on task events, a new submission waits for them to be
        handled (placing takes the CPU they need), up to EVENTS_WAIT_S. True if it waited."""
        if not self.events_behind():
            return False
        self.held_submissions += 1
        self.events_caught_up.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.events_caught_up.wait(), EVENTS_WAIT_S)
        return True

    async def on_task_event(self, msg: Msg) -> None:
        """A task event from a replay of MARS_EVENTS (the live path also lands in
        `_task_event`)."""
        try:
            ev = decode(msg.data, TaskEvent)
        except DecodeError:
            return
        if subjects.pipeline_of_task_event(msg.subject) == ev.pipeline_id and (
            self.sent_by_its_agent(msg, ev)
        ):
            await self.apply_event(ev)

    def sent_by_its_agent(self, msg: Msg, ev: TaskEvent) -> bool:
        """Whether a task event's subject names the agent its payload says sent it: only
        that agent may publish that subject (the server's permissions), so one agent cannot
        report another's task. An agent of wire level 4 or older names none; one that reads
        a later level (by its adverts) always does, so an event without a name is taken
        only from an older one."""
        named = subjects.agent_of_task_event(msg.subject)
        if named == ev.agent_id or (named is None and self.wire_of(ev.agent_id) < SENDER_SUBJECTS):
            return True
        self.misnamed_events += 1
        log.info(
            "dropped task event %s of %s/%s: its payload names agent %s, its subject %s",
            ev.event_id, ev.pipeline_id, ev.task_id, ev.agent_id, msg.subject,
        )  # fmt: skip
        return False

    async def apply_event(self, ev: TaskEvent) -> None:
        run = self.pipelines.get(ev.pipeline_id)
        if run is None or not self.failover.may_act(run.pipeline_id):
            return  # not ours, or our lease lapsed: fenced (replayed from the stream once back)
        await self.carry_out(run, lifecycle.step(run, lifecycle.Heard(ev), self.mono()))

    async def carry_out(
        self, run: PipelineRun, effects: Sequence[lifecycle.Effect], answering: bool = False
    ) -> None:
        """Do what the pipeline's state machine asked for, in its order. `answering`: inside
        the API handler answering for the pipeline: the commits and the record begin once the
        reply is written (tasks spawned now would run before it)."""
        for e in effects:
            match e:
                case lifecycle.GiveBack(task_id):
                    self._give_back_later(run, task_id)
                case lifecycle.RunAgain(task_id, why):
                    self.recovery.run_again(run, task_id, why)
                case lifecycle.CommitResult(ev):
                    self.recovery.commit_result(run, ev)
                case lifecycle.SettleResults():
                    await self.recovery.settle(run.pipeline_id)
                case lifecycle.Learn(ev):
                    self._learn(run, ev)
                case lifecycle.ProducerEnded(task_id):
                    await self.displaced.producer_ended(run, task_id)
                    if self.commits.awaited:
                        self.commits.look_sooner(run, task_id)
                case lifecycle.HoldStarted(task_id, token):
                    self.spawn(self.displaced.hold_started(run, task_id, token))
                case lifecycle.CancelOnAgents(reason):
                    await self.cancel_on_agents(run, reason)
                case lifecycle.Close():
                    await self.finished(run)  # persisted before anyone hears it ended
                    await self.publish_pipeline(run)
                case lifecycle.Publish():
                    await self.publish_pipeline(run)
                case lifecycle.Record() if answering:
                    self.spawn(after_reply(self.persist(run)))
                case lifecycle.Record():
                    await self.persist(run)
                case lifecycle.Progress():
                    self.failover.progress(run)  # a finished task: what a new owner resumes from
                case lifecycle.HearAgain(events):
                    self.spawn(self._hear_again(events))
                case lifecycle.CommitTasks(tasks) if answering:
                    commit = self.commits.commit_all(run, set(tasks), unanswered=True)
                    self.spawn(after_reply(commit))
                case lifecycle.CommitTasks(tasks):
                    await self.commits.commit_all(run, set(tasks))
                case lifecycle.Changed():
                    await self.notify_changed()

    async def _hear_again(self, events: Sequence[TaskEvent]) -> None:
        """Events kept while their placements were detached, through the normal event path
        (out of the pipeline's recovery lock: an end may start another recovery)."""
        for ev in events:
            await self.apply_event(ev)

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
            run.spec_by_id[ev.task_id], key, spec, ev.duration_s, self.wall(),
            base_s=tr.base_s, cold=ev.cold, load_s=ev.load_s, shared=ev.shared,
        )  # fmt: skip
        if changed is not None and self.history is not None:
            self.history.mark(*changed)  # written by the history loop, once per window

    async def publish_pipeline(self, run: PipelineRun, recorded: bool = True) -> None:
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
            at_s=max(0.0, self.mono() - run.submitted_at),
        )
        body = encode(ev)
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.pipeline_event(run.pipeline_id), body)
            if run.spec.user is not None:
                await self.nc.publish(
                    subjects.user_pipeline_event(run.spec.user, run.pipeline_id), body
                )

    # -- API ------------------------------------------------------------------------------------
    async def submit_spec(self, spec: PipelineSpec, pipeline_id: str | None = None) -> SubmitReply:
        """In-process submit (tests, tools): the same path as the API."""
        return await self.submissions.submit(SubmitRequest(pipeline=spec, pipeline_id=pipeline_id))

    async def status_of(self, pipeline_id: str) -> StatusReply:
        return await self.queries.status(StatusRequest(pipeline_id=pipeline_id))

    def remember(self, run: PipelineRun) -> None:
        self.pipelines[run.pipeline_id] = run
        if len(self.pipelines) > self._trim_at:
            # in steps, not on every submission: finding the finished ones visits them all
            self.forget_finished(MAX_PIPELINES_KEPT)
            self._trim_at = max(len(self.pipelines), MAX_PIPELINES_KEPT) + TRIM_STEP

    def forget_finished(self, keep: int) -> None:
        """Drop finished pipelines down to `keep` held in memory (their records stay). One
        whose end is not recorded yet stays (its lease lapsed as it ended: the end is written
        once the lease is renewed, from this run; dropped, the lease would be renewed for
        ever over a record saying running, and the pipeline never end)."""
        held = self.failover.holds
        done = [p for p, r in self.pipelines.items() if r.terminal and not held(p)]
        for pid in done[: max(0, len(self.pipelines) - keep)]:
            del self.pipelines[pid]

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
        level."""
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
        except nats.errors.MaxPayloadError:  # never sent: no agent could be offered it
            return OfferReply(
                pipeline_id=offer.pipeline_id, task_id=offer.task.id, agent_id=offer.agent_id,
                accepted=False, code="bad_spec",
                reason=f"the offer is larger than the server's {self.nc.max_payload} B limit",
            )  # fmt: skip

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

        async def one_batch(agent_id: str, first: list[int]) -> None:
            # a batch larger than the server takes goes in halves, in turn (a loop: a closure
            # calling itself is a reference cycle, left to the collector with all it holds)
            todo = [first]
            while todo:
                idx = todo.pop(0)
                mine = [offers[i] for i in idx]
                if len(mine) == 1:
                    out[idx[0]] = await self.offer(mine[0])
                    continue
                assert self.nc is not None
                try:
                    batch = OfferBatch(offers=mine, sent_at=self.wall())
                    rep = await self.ask_agent(
                        subjects.offers, agent_id, batch, OfferBatchReply,
                        timeout=OFFER_TIMEOUT_S, encoding=AGENT_ENCODING,
                    )  # fmt: skip
                    replies: list[OfferReply] = rep.replies
                except nats.errors.MaxPayloadError:  # larger than the server takes: in halves
                    half = len(idx) // 2
                    todo[:0] = [idx[:half], idx[half:]]
                    continue
                except nats.errors.NoRespondersError:
                    replies = list(await asyncio.gather(*(self.offer(x) for x in mine)))
                except (TimeoutError, RemoteError) as exc:
                    why = f"no answer to offers: {type(exc).__name__} {exc}"[:2048]
                    replies = [_unanswered(x, why) for x in mine]
                got = {r.task_id: r for r in replies}
                for i, x in zip(idx, mine, strict=True):
                    out[i] = got.get(x.task.id) or _unanswered(x, "no reply for this offer")

        async def one_agent(agent_id: str, idx: list[int]) -> None:
            # more offers than one batch holds go in several, one after another: the agent
            # reads them in turn, and each is given its own OFFER_TIMEOUT_S to be answered
            # (sent at once, the last waited for all of them, and a busy host's timed out)
            for i in range(0, len(idx), MAX_BATCH):
                await one_batch(agent_id, idx[i : i + MAX_BATCH])

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

    async def finished(self, run: PipelineRun) -> None:
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
        await self.notify_changed()

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
        now = self.mono()
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

    async def cancel_on_agents(self, run: PipelineRun, reason: str) -> None:
        assert self.nc is not None
        cmd = CancelCommand(pipeline_id=run.pipeline_id, reason=reason[:2048])
        agents = sorted({tr.agent_id for tr in run.tasks.values() if tr.agent_id})
        for a in agents:
            with contextlib.suppress(Exception):
                await self.tell_agent(subjects.cancel, a, cmd)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        """In-process wait until `predicate` holds (re-checked on every pipeline change)."""
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(predicate)

    async def wait_terminal(self, pipeline_id: str, timeout: float) -> PipelineRun:
        """In-process wait (used by tests and the demo)."""
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(
                lambda: pipeline_id in self.pipelines and self.pipelines[pipeline_id].settled
            )
        return self.pipelines[pipeline_id]


def _unanswered(offer: TaskOffer, reason: str) -> OfferReply:
    return OfferReply(
        pipeline_id=offer.pipeline_id,
        task_id=offer.task.id,
        agent_id=offer.agent_id,
        accepted=False,
        code="unhealthy",
        reason=reason,
    )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run_orchestrator(
    nats_url: str,
    stop: asyncio.Event | None = None,
    name: str | None = None,
    plan_budget_s: float = PLAN_BUDGET_S,
    started: asyncio.Event | None = None,
    keep_s: float = ownership.KEEP_S,
    booking_key_max_bytes: int = KEY_MAX_BYTES,
    retry_start: bool = False,
    say: Callable[[str], None] | None = None,
) -> None:
    """The orchestrator of a process of its own (`mars orchestrator`): its garbage collector
    is paced (`eventloop.PacedGc`), collections waiting for a moment with no submission
    under way. `started` is set once it serves. `retry_start`: a start that fails on NATS
    (JetStream still electing its leaders on a fresh or recovering cluster) is said on
    stderr and tried again with a growing wait, until it succeeds or `stop` is set."""
    stop = stop or asyncio.Event()
    wait = START_RETRY_FIRST_S
    while True:
        orch = Orchestrator(
            nats_url, name=name, plan_budget_s=plan_budget_s, keep_s=keep_s,
            booking_key_max_bytes=booking_key_max_bytes,
        )  # fmt: skip
        try:
            await orch.start()
            break
        except (nats.errors.Error, TimeoutError, OSError) as exc:
            with contextlib.suppress(Exception):
                await orch.stop()
            if not retry_start:
                raise
            (say or _say)(
                f"starting failed: {type(exc).__name__}: {exc}; trying again in {wait:g} s"
            )
            if await eventloop.wait_event(stop, wait):
                return
            wait = min(2 * wait, START_RETRY_MAX_S)
    pacer = eventloop.PacedGc(orch.idle)
    pacer.start()
    paced = asyncio.create_task(pacer.run())
    if started is not None:
        started.set()
    try:
        await stop.wait()
    finally:
        try:
            await orch.stop()
        finally:
            paced.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await paced
            pacer.stop()
