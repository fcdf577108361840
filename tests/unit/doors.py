"""Stand-ins for the service behind a collaborator's door (orchestrator/ports.py), for unit
tests with no NATS: each has its door's members (mypy checks them against the protocol where
a test hands one to a collaborator) and keeps what the collaborator asked of the service.
Clocks move only when a test moves them; whatever is spawned runs when a test `settle`s it.
A port member a test does not expect the collaborator to reach raises, so reaching it fails
the test."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from orchestrator.placement.placer import PlacementFailed, planned_view
from orchestrator.placement.registry import ClusterView
from orchestrator.ports import (
    AskKind,
    CommitsPort,
    DisplacedPort,
    FailoverPort,
    M,
    PlacerPort,
    RecoveryPort,
    WatchdogPort,
)
from orchestrator.predictor.model import Predictor
from orchestrator.reliability.results import ResultLedger
from orchestrator.reservations.store import BookingStore
from orchestrator.scheduling import Placement
from orchestrator.state import lifecycle
from orchestrator.state.pipelines import PipelineRun
from schemas.agent import AgentAdvert, DeviceSpec
from schemas.api import StatusReply, SubmitReply, TaskState
from schemas.base import WireModel
from schemas.bookings import BookingWindow
from schemas.codec import Encoding
from schemas.pipeline import PipelineSpec
from schemas.placement import OfferReply, TaskOffer


def unexpected(what: str) -> AssertionError:
    return AssertionError(f"the collaborator reached {what}, which this test does not expect")


@dataclass
class Sent:
    """One message to an agent: its subject, agent, the message, and whether it was a
    request (`ask_agent`) or a plain message (`tell_agent`)."""

    subject: str
    agent_id: str
    msg: WireModel
    asked: bool


class Failover:
    """The fail-over port: this replica may act for every pipeline but those in `not_ours`
    (held still, lease lapsed, for those in `held`); `replay` counts and runs `on_replay`."""

    def __init__(self) -> None:
        self.not_ours: set[str] = set()
        self.held: set[str] = set()
        self.replayed: list[str] = []
        self.on_replay: Callable[[PipelineRun], None] = lambda run: None

    def may_act(self, pid: str) -> bool:
        return pid not in self.not_ours

    def holds(self, pid: str) -> bool:
        return pid in self.held or pid not in self.not_ours

    async def replay(self, run: PipelineRun) -> int:
        self.replayed.append(run.pipeline_id)
        self.on_replay(run)
        return 0

    async def claim(self, pid: str, spec: PipelineSpec) -> SubmitReply | None:
        raise unexpected("failover.claim")

    async def forget_unplaced(self, pid: str) -> None:
        raise unexpected("failover.forget_unplaced")

    def give_back_strays(self, pid: str, keep: Collection[str]) -> None:
        raise unexpected("failover.give_back_strays")

    async def holder(self, pid: str) -> str | None:
        raise unexpected("failover.holder")

    async def lapsed_elsewhere(self, pid: str) -> bool:
        raise unexpected("failover.lapsed_elsewhere")

    def let_go(self, pid: str) -> None:
        raise unexpected("failover.let_go")

    def save_spec(self, run: PipelineRun) -> None:
        raise unexpected("failover.save_spec")

    async def spec_saved(self, pid: str) -> None:
        raise unexpected("failover.spec_saved")

    async def spec_written(self, run: PipelineRun) -> bool:
        raise unexpected("failover.spec_written")

    async def status_elsewhere(self, pid: str) -> StatusReply | None:
        raise unexpected("failover.status_elsewhere")


@dataclass
class WatchdogAsks:
    """The watchdog port: keeps each `ask_about` (pipeline, tasks, kind)."""

    stall_s: float = 10.0
    asked: list[tuple[str, list[str], AskKind]] = field(default_factory=list)

    async def ask_about(self, run: PipelineRun, tids: list[str], kind: AskKind) -> None:
        self.asked.append((run.pipeline_id, list(tids), kind))


@dataclass
class CommitsAsks:
    """The commits port: keeps each `commit_all` (pipeline, tasks, unanswered, look)."""

    committed: list[tuple[str, set[str], bool, bool]] = field(default_factory=list)

    async def commit_all(
        self, run: PipelineRun, task_ids: set[str], *, unanswered: bool = False, look: bool = True
    ) -> None:
        self.committed.append((run.pipeline_id, set(task_ids), unanswered, look))


class Recovery:
    """The recovery port: keeps the starved tasks handed to it."""

    def __init__(self) -> None:
        self.starved: list[tuple[str, set[str]]] = []

    @property
    def ledger(self) -> ResultLedger | None:
        return None

    def lock(self, pipeline_id: str) -> asyncio.Lock:
        raise unexpected("recovery.lock")

    async def recover_run(
        self,
        run: PipelineRun,
        seeds: set[str] | None,
        gone: set[str],
        why: str,
        incarnations: Mapping[str, str] | None = None,
        starved: set[str] | None = None,
        lost: set[str] | None = None,
        still: Callable[[], bool] | None = None,
    ) -> None:
        raise unexpected("recovery.recover_run")

    async def rerun_lost(
        self,
        run: PipelineRun,
        producers: set[str],
        why: str,
        still: Callable[[], bool] | None = None,
    ) -> None:
        raise unexpected("recovery.rerun_lost")

    async def rerun_starved(self, run: PipelineRun, tasks: set[str]) -> None:
        self.starved.append((run.pipeline_id, set(tasks)))


@dataclass
class Cancelled:
    """One `cancel_tasks`: the pipeline, each task with the device it is withdrawn from, why,
    and the highest token withdrawn."""

    pipeline_id: str
    where: dict[str, str]
    reason: str
    max_token: int | None


#: How a stand-in agent answers a request: (subject, agent, message) -> reply; raise to fail.
Answer = Callable[[str, str, WireModel], WireModel]


def no_answer(subject: str, agent_id: str, msg: WireModel) -> WireModel:
    raise TimeoutError(f"{agent_id} did not answer {subject}")


class _Service:
    """What the doors share: a clock moved by hand, spawned work run on `settle`, agents
    answering by `answer`, and every message sent to one kept in `sent`."""

    def __init__(self, now: float = 1000.0, answer: Answer = no_answer) -> None:
        self.now = now
        self.wall_offset = 1.7e9  # the booking clock: another epoch than the monotonic one
        self.answer = answer
        self.sent: list[Sent] = []
        self.spawned: list[asyncio.Task[Any]] = []
        self.pipelines: dict[str, PipelineRun] = {}
        self.behind = False
        self.failover = Failover()
        self.cancelled: list[Cancelled] = []

    def mono(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.wall_offset + self.now

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self.spawned.append(task)
        return task

    async def settle(self, leave: Collection[asyncio.Task[Any]] = ()) -> None:
        """Run everything spawned (and what that spawns) to its end, but what is in `leave`
        (a loop that never ends); raises what it raised."""
        while pending := [t for t in self.spawned if not t.done() and t not in leave]:
            await asyncio.gather(*pending)
        for t in self.spawned:
            if t not in leave:
                t.result()  # an error in one fails the test

    async def stop(self) -> None:
        """Cancel what still runs of what was spawned, as the service does when it stops. A
        task can drop a cancellation (Python 3.11's `asyncio.wait_for`, when what it waits
        for is done in the same turn): it is cancelled again, a few turns later, until it
        ends."""
        for _ in range(100):
            pending = [t for t in self.spawned if not t.done()]
            if not pending:
                return
            for t in pending:
                t.cancel()
            for _ in range(5):
                await asyncio.sleep(0)
        raise AssertionError(f"spawned tasks still running after being cancelled: {pending}")

    async def ask_agent(
        self,
        subject_of: Callable[[str], str],
        agent_id: str,
        msg: WireModel,
        reply_model: type[M],
        *,
        timeout: float,
        encoding: Encoding = "msgpack",
    ) -> M:
        subject = subject_of(agent_id)
        self.sent.append(Sent(subject, agent_id, msg, asked=True))
        rep = self.answer(subject, agent_id, msg)
        assert isinstance(rep, reply_model)
        return rep

    async def tell_agent(
        self,
        subject_of: Callable[[str], str],
        agent_id: str,
        msg: WireModel,
        *,
        encoding: Encoding = "msgpack",
    ) -> None:
        self.sent.append(Sent(subject_of(agent_id), agent_id, msg, asked=False))

    async def cancel_tasks(
        self,
        run: PipelineRun,
        where: dict[str, Placement],
        reason: str,
        max_token: int | None = None,
    ) -> None:
        self.cancelled.append(
            Cancelled(
                run.pipeline_id, {t: p.device_id for t, p in where.items()}, reason, max_token
            )
        )

    def events_behind(self) -> bool:
        return self.behind


class CommitsService(_Service):
    """The service as commits sees it (`CommitsDoor`)."""

    def __init__(self, now: float = 1000.0, answer: Answer = no_answer) -> None:
        super().__init__(now, answer)
        self.watchdog = WatchdogAsks()


class WatchdogService(_Service):
    """The service as the watchdog sees it (`WatchdogDoor`). `nc` is an unconnected client:
    the watchdog only looks whether there is one before it asks an agent."""

    def __init__(self, now: float = 1000.0, answer: Answer = no_answer) -> None:
        super().__init__(now, answer)
        self.nc: NATS | None = NATS()
        self.commits = CommitsAsks()
        self.recovery = Recovery()

    def events_backlog(self) -> int:
        return 1 if self.behind else 0


# -- JetStream in memory ------------------------------------------------------------------------


@dataclass(frozen=True)
class KVEntry:
    """A key's value as nats-py's `KeyValue.Entry` has it (what readers look at)."""

    key: str
    value: bytes | None
    revision: int
    #: None: a value; "DEL": a delete marker.
    operation: str | None = None


class MemoryKV:
    """A JetStream KV bucket in memory, with the calls the booking store and the result ledger
    make of one, answered as nats-py answers them: `create` only where the key holds no value,
    `update` only at the key's last revision (`last=0`: none yet), revisions counting the
    whole bucket. Every key written is kept in `written`, in order."""

    def __init__(self, ttl: float = 0.0, history: int = 1) -> None:
        self.entries: dict[str, KVEntry] = {}
        self.revision = 0
        self.written: list[str] = []
        self.ttl, self.history = ttl, history

    def _put(self, key: str, value: bytes | None, operation: str | None = None) -> int:
        self.revision += 1
        self.entries[key] = KVEntry(key, value, self.revision, operation)
        self.written.append(key)
        return self.revision

    async def create(self, key: str, value: bytes) -> int:
        cur = self.entries.get(key)
        if cur is not None and cur.operation is None:
            raise KeyWrongLastSequenceError(f"wrong last sequence: {cur.revision}")
        return self._put(key, value)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        cur = self.entries.get(key)
        at = cur.revision if cur is not None else 0
        if last is not None and last != at:
            raise KeyWrongLastSequenceError(f"wrong last sequence: {at}")
        return self._put(key, value)

    async def put(self, key: str, value: bytes) -> int:
        return self._put(key, value)

    async def get(self, key: str) -> KVEntry:
        cur = self.entries.get(key)
        if cur is None or cur.operation is not None:
            raise KeyNotFoundError(message=key)
        return cur

    async def delete(self, key: str, last: int | None = None) -> bool:
        cur = self.entries.get(key)
        if last is not None and last != (cur.revision if cur is not None else 0):
            raise KeyWrongLastSequenceError("wrong last sequence")
        self._put(key, None, "DEL")
        return True

    async def status(self) -> Any:
        values = sum(1 for e in self.entries.values() if e.operation is None)
        return SimpleNamespace(ttl=self.ttl, history=self.history, values=values)


class MemoryJS:
    """A JetStream context whose buckets are `MemoryKV`s, each made when first opened (with
    this max age and history)."""

    def __init__(self, ttl: float = 0.0, history: int = 64) -> None:
        self.ttl, self.history = ttl, history
        self.buckets: dict[str, MemoryKV] = {}

    async def key_value(self, bucket: str) -> MemoryKV:
        return self.buckets.setdefault(bucket, MemoryKV(self.ttl, self.history))


def store_on(kv: MemoryKV) -> BookingStore:
    """A booking store writing to `kv` (no watch: its cache holds what it wrote or re-read;
    another replica's writes it finds when a CAS write of its own is refused)."""
    store = BookingStore(js=None)
    store.kv = kv
    return store


class Unconnected(NATS):
    """A client that never connects: subscriptions are kept in `subscribed`, not sent; it
    says it is not connected, so nobody publishes on it."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribed: list[str] = []

    async def subscribe(self, subject: str, *args: Any, **kwargs: Any) -> Any:
        self.subscribed.append(subject)


def advert(
    agent_id: str, *, slots: int = 1, gflops: float = 10.0, incarnation: str = "i1", seq: int = 0
) -> AgentAdvert:
    """An agent with one CPU (`cpu0`), beating once a minute (so it stays alive however far a
    test moves the clock)."""
    return AgentAdvert(
        agent_id=agent_id, incarnation=incarnation, site="s", tier="edge", seq=seq,
        heartbeat_interval_s=60.0,
        devices=[DeviceSpec(device_id="cpu0", kind="cpu", slots=slots, gflops=gflops)],
    )  # fmt: skip


# -- ports of the placement collaborators ---------------------------------------------------------


class Displaced:
    """The displaced-tasks port: keeps each producer rerouting (pipeline, task -> device it
    moved to), each eviction told (key, tasks, by) and each start not heard."""

    def __init__(self) -> None:
        self.rerouted: list[tuple[str, dict[str, str]]] = []
        self.evicted: list[tuple[str, list[str], str]] = []
        self.unheard: list[tuple[str, str, int]] = []

    def drop_parked(self, pid: str) -> None:
        raise unexpected("displaced.drop_parked")

    async def notify_evicted(self, key: str, windows: list[BookingWindow], by: str) -> None:
        self.evicted.append((key, [w.task_id for w in windows], by))

    async def reroute_producers(self, run: PipelineRun, moved: Mapping[str, Placement]) -> None:
        self.rerouted.append((run.pipeline_id, {t: p.device_id for t, p in moved.items()}))

    async def resume(self, pid: str) -> None:
        raise unexpected("displaced.resume")

    def started_unheard(self, pipeline_id: str, task_id: str, token: int) -> None:
        self.unheard.append((pipeline_id, task_id, token))


@dataclass(frozen=True)
class PlaceAsk:
    """One `place`: the pipeline, the tasks to place, the (task, device) pairs ruled out, and
    each task as it stood when asked (state, agent, token)."""

    pipeline_id: str
    only: frozenset[str]
    exclude: frozenset[tuple[str, str]]
    found: dict[str, tuple[TaskState, str | None, int]]


class PlacerAsks:
    """The placer port: keeps each `place` (`asked`) and runs `during` (what is heard while
    it runs); then fails (`PlacementFailed`) while `fail` is set, else binds each task through
    the state machine to the first of `devices` its `exclude` leaves it, under a new token
    (from 101 up), keeping its planned times."""

    def __init__(self, devices: Sequence[str], clock: Callable[[], float]) -> None:
        self.devices = list(devices)
        self.clock = clock
        self.fail = False
        self.during: Callable[[PipelineRun], None] = lambda run: None
        self.asked: list[PlaceAsk] = []
        self.token = 100

    async def place(
        self,
        run: PipelineRun,
        only: set[str] | None = None,
        exclude: set[tuple[str, str]] | None = None,
        gate: Any = None,
    ) -> None:
        tasks = set(run.tasks) if only is None else set(only)
        ruled_out = frozenset(exclude or ())
        found = {t: (run.tasks[t].state, run.tasks[t].agent_id, run.tasks[t].token) for t in tasks}
        self.asked.append(PlaceAsk(run.pipeline_id, frozenset(tasks), ruled_out, found))
        self.during(run)
        if self.fail:
            raise PlacementFailed("no device fits (stand-in)", {t: "full" for t in sorted(tasks)})
        placements = dict(run.placements)
        bound: dict[str, lifecycle.BoundTask] = {}
        for t in sorted(tasks):
            dev = next((d for d in self.devices if (t, d) not in ruled_out), None)
            if dev is None:
                raise PlacementFailed(f"{t}: every device ruled out (stand-in)", {})
            old = run.placements.get(t)
            start, finish = (old.start, old.finish) if old is not None else (0.0, 1.0)
            placements[t] = Placement(t, dev, 0, start, finish)
            self.token += 1
            agent_id, device_id = dev.split(":", 1)
            bound[t] = lifecycle.BoundTask(agent_id, device_id, self.token, finish - start, None)
        b = lifecycle.Bound(placements, planned_view(placements), "stand-in", bound)
        lifecycle.step(run, b, self.clock())

    async def withdrawn(self, pid: str) -> None:
        raise unexpected("placer.withdrawn")


class RecoveryLocks(Recovery):
    """The recovery port where a re-placement's lock is taken: one lock per pipeline."""

    def __init__(self) -> None:
        super().__init__()
        self.locks: dict[str, asyncio.Lock] = {}

    def lock(self, pipeline_id: str) -> asyncio.Lock:
        return self.locks.setdefault(pipeline_id, asyncio.Lock())


# -- the placement collaborators' services --------------------------------------------------------


def accept(offer: TaskOffer) -> OfferReply:
    """An agent that takes every offer."""
    return OfferReply(
        pipeline_id=offer.pipeline_id, task_id=offer.task.id, agent_id=offer.agent_id,
        accepted=True,
    )  # fmt: skip


#: How a stand-in agent answers an offer.
OfferAnswer = Callable[[TaskOffer], OfferReply]


class PlacerService(_Service):
    """The service as placement sees it (`PlacerDoor`): the fleet is `view` (the test puts
    adverts in), bookings go to a real `BookingStore` on an in-memory bucket (`kv`), every
    offer is answered at once by `offer_answer` (taken, by default) and kept in `offers`, in
    the order sent. Plans get no time beyond HEFT (`plan_budget_s` 0): the same every run."""

    def __init__(self, now: float = 1000.0, offer_answer: OfferAnswer = accept) -> None:
        super().__init__(now)
        self.owner = "orch-1"
        self.lease_s = 30.0
        self.plan_budget_s = 0.0
        self.view = ClusterView()
        self.kv = MemoryKV()
        self.store = store_on(self.kv)
        self.predictor = Predictor()
        self.displaced = Displaced()
        self.offer_answer = offer_answer
        self.offers: list[TaskOffer] = []

    def wire_of(self, agent_id: str) -> int:
        return 1

    async def offer_many(self, offers: Sequence[TaskOffer]) -> list[OfferReply]:
        return self._answers(offers)

    def start_offers(self, offers: Sequence[TaskOffer]) -> asyncio.Future[list[OfferReply]]:
        answered: asyncio.Future[list[OfferReply]] = asyncio.get_running_loop().create_future()
        answered.set_result(self._answers(offers))
        return answered

    def _answers(self, offers: Sequence[TaskOffer]) -> list[OfferReply]:
        self.offers += offers
        return [self.offer_answer(x) for x in offers]


class _Orchestrating(_Service):
    """What the recovery's and adaptive's doors share: `nc` an unconnected client (`bus`:
    what is subscribed is kept; nothing is published), the fleet (`view`), bookings on an
    in-memory bucket, commits, displaced tasks and placement as stand-in ports; each record
    written (`persisted`), each wake-up (`woken`) and each batch of effects carried out
    (`carried`) kept. The placer binds tasks to `devices`, in that order of preference."""

    def __init__(
        self, now: float = 1000.0, answer: Answer = no_answer, devices: Sequence[str] = ()
    ) -> None:
        super().__init__(now, answer)
        self.owner = "orch-1"
        self.bus = Unconnected()
        self.nc: NATS | None = self.bus
        self.view = ClusterView()
        self.kv = MemoryKV()
        self.store = store_on(self.kv)
        self.commits = CommitsAsks()
        self.displaced = Displaced()
        self.placer = PlacerAsks(devices, self.mono)
        self.persisted: list[str] = []
        self.woken = 0
        self.carried: list[tuple[str, list[lifecycle.Effect]]] = []

    async def notify_changed(self) -> None:
        self.woken += 1

    async def persist(self, run: PipelineRun) -> None:
        self.persisted.append(run.pipeline_id)

    async def carry_out(
        self, run: PipelineRun, effects: Sequence[lifecycle.Effect], answering: bool = False
    ) -> None:
        self.carried.append((run.pipeline_id, list(effects)))


class RecoveryService(_Orchestrating):
    """The service as recovery sees it (`RecoveryDoor`); JetStream is in memory (`js`: the
    result ledger's bucket)."""

    def __init__(
        self, now: float = 1000.0, answer: Answer = no_answer, devices: Sequence[str] = ()
    ) -> None:
        super().__init__(now, answer, devices)
        self.keep_s = 3600.0
        self.js = MemoryJS(ttl=self.keep_s)
        self.cluster_changed = asyncio.Event()


class AdaptiveService(_Orchestrating):
    """The service as adaptive re-scheduling sees it (`AdaptiveDoor`), with the real
    predictor (planning's cost model)."""

    def __init__(self, now: float = 1000.0, devices: Sequence[str] = ()) -> None:
        super().__init__(now, no_answer, devices)
        self.predictor = Predictor()
        self.recovery = RecoveryLocks()


async def turns(n: int = 10) -> None:
    """Let other tasks run `n` turns of the event loop (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


def _doors_opened() -> None:
    """Never called: mypy checks here that each stand-in opens its door (and each port)."""
    from orchestrator.ports import (
        AdaptiveDoor,
        CommitsDoor,
        PlacerDoor,
        RecoveryDoor,
        WatchdogDoor,
    )

    _c: CommitsDoor = CommitsService()
    _w: WatchdogDoor = WatchdogService()
    _p: PlacerDoor = PlacerService()
    _rd: RecoveryDoor = RecoveryService()
    _a: AdaptiveDoor = AdaptiveService()
    _dp: DisplacedPort = Displaced()
    _pp: PlacerPort = PlacerAsks([], time.monotonic)
    _rl: RecoveryPort = RecoveryLocks()
    _f: FailoverPort = Failover()
    _r: RecoveryPort = Recovery()
    _cp: CommitsPort = CommitsAsks()
    _wp: WatchdogPort = WatchdogAsks()
