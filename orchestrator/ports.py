"""The doors between the orchestrator's parts, as protocols: each collaborator of the service
(placement, commits, recovery, ...) is typed against its own door (`PlacerDoor`, ...), which
names exactly what it reaches of the service, and sees its siblings through their ports
(`CommitsPort`, ...). None imports the service class, each can be driven by a stand-in that
has just its door's members, and mypy checks that the service opens every door where it
hands itself over. Doors are put together from the small abilities below (a clock, spawning,
asking an agent, ...), so each ability is declared once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from schemas.base import WireModel

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg

    from orchestrator.placement.registry import ClusterView
    from orchestrator.placement.store_reads import StoreLookup
    from orchestrator.predictor.model import Predictor
    from orchestrator.reliability.results import ResultLedger
    from orchestrator.reservations.store import BookingStore
    from orchestrator.scheduling import Placement
    from orchestrator.state.lifecycle import Effect
    from orchestrator.state.pipelines import PipelineRun
    from schemas.api import StatusReply, StatusRequest, SubmitReply
    from schemas.bookings import BookingWindow
    from schemas.codec import Encoding
    from schemas.pipeline import PipelineSpec
    from schemas.placement import EvictNotice, OfferReply, TaskOffer

M = TypeVar("M", bound=WireModel)
#: Why the watchdog asks agents about tasks.
AskKind = Literal["overdue", "stalled", "waiting", "adopted", "unbooked", "unstarted"]


class CommitsPort(Protocol):
    async def commit_all(
        self, run: PipelineRun, task_ids: set[str], *, unanswered: bool = False, look: bool = True
    ) -> None: ...


class DisplacedPort(Protocol):
    def drop_parked(self, pid: str) -> None: ...
    async def notify_evicted(self, key: str, windows: list[BookingWindow], by: str) -> None: ...
    async def reroute_producers(self, run: PipelineRun, moved: Mapping[str, Placement]) -> None: ...
    async def resume(self, pid: str) -> None: ...
    def started_unheard(self, pipeline_id: str, task_id: str, token: int) -> None: ...


class FailoverPort(Protocol):
    async def claim(self, pid: str, spec: PipelineSpec) -> SubmitReply | None: ...
    async def forget_unplaced(self, pid: str) -> None: ...
    def give_back_strays(self, pid: str, keep: Collection[str]) -> None: ...
    async def holder(self, pid: str) -> str | None: ...
    def holds(self, pid: str) -> bool: ...
    async def lapsed_elsewhere(self, pid: str) -> bool: ...
    def let_go(self, pid: str) -> None: ...
    def may_act(self, pid: str) -> bool: ...
    async def replay(self, run: PipelineRun) -> int: ...
    def save_spec(self, run: PipelineRun) -> None: ...
    async def spec_saved(self, pid: str) -> None: ...
    async def spec_written(self, run: PipelineRun) -> bool: ...
    async def status_elsewhere(self, pid: str) -> StatusReply | None: ...


class PlacerPort(Protocol):
    async def place(
        self,
        run: PipelineRun,
        only: set[str] | None = None,
        exclude: set[tuple[str, str]] | None = None,
        gate: Awaitable[object] | None = None,
    ) -> None: ...
    async def withdrawn(self, pid: str) -> None: ...


class QueriesPort(Protocol):
    async def cancel_lost(self, run: PipelineRun) -> None: ...
    async def status(self, req: StatusRequest) -> StatusReply: ...


class RecoveryPort(Protocol):
    @property
    def ledger(self) -> ResultLedger | None: ...
    def lock(self, pipeline_id: str) -> asyncio.Lock: ...
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
    ) -> None: ...
    async def rerun_lost(
        self,
        run: PipelineRun,
        producers: set[str],
        why: str,
        still: Callable[[], bool] | None = None,
    ) -> None: ...
    async def rerun_starved(self, run: PipelineRun, tasks: set[str]) -> None: ...


class ReplicasPort(Protocol):
    def up(self) -> list[str]: ...


class SubmissionsPort(Protocol):
    async def place_anew(self, pid: str, spec: PipelineSpec, why: str) -> None: ...


class WatchdogPort(Protocol):
    async def ask_about(self, run: PipelineRun, tids: list[str], kind: AskKind) -> None: ...
    @property
    def stall_s(self) -> float: ...


class AdaptivePort(Protocol):
    def evicted(self, note: EvictNotice) -> None: ...


# -- abilities: what a door is made of ----------------------------------------------------------


class Clock(Protocol):
    """Monotonic time for durations; wall time for bookings (shared with other replicas)."""

    def mono(self) -> float: ...
    def wall(self) -> float: ...


class Spawns(Protocol):
    """Background work, cancelled when the service stops."""

    def spawn(self, coro: Any) -> asyncio.Task[Any]: ...


class Wakes(Protocol):
    """Whoever waits on a pipeline's state."""

    async def notify_changed(self) -> None: ...


class Identity(Protocol):
    @property
    def owner(self) -> str: ...


class Bus(Protocol):
    @property
    def nc(self) -> NATS | None: ...


class JetStream(Protocol):
    @property
    def js(self) -> Any: ...


class AsksAgents(Protocol):
    """A request to one agent, at the wire level it reads."""

    async def ask_agent(
        self,
        subject_of: Callable[[str], str],
        agent_id: str,
        msg: WireModel,
        reply_model: type[M],
        *,
        timeout: float,
        encoding: Encoding = "msgpack",
    ) -> M: ...


class TellsAgents(Protocol):
    """A plain message to one agent, at the wire level it reads."""

    async def tell_agent(
        self,
        subject_of: Callable[[str], str],
        agent_id: str,
        msg: WireModel,
        *,
        encoding: Encoding = "msgpack",
    ) -> None: ...


class CancelsTasks(Protocol):
    """Withdraw tasks from where they were placed."""

    async def cancel_tasks(
        self,
        run: PipelineRun,
        where: dict[str, Placement],
        reason: str,
        max_token: int | None = None,
    ) -> None: ...


class HoldsPipelines(Protocol):
    """The pipelines this replica holds, and their records."""

    @property
    def pipelines(self) -> dict[str, PipelineRun]: ...
    async def persist(self, run: PipelineRun) -> None: ...


class CarriesEffects(Protocol):
    """Carry out what the pipeline state machine (`state.lifecycle`) asked for."""

    async def carry_out(
        self, run: PipelineRun, effects: Sequence[Effect], answering: bool = False
    ) -> None: ...


class SeesFleet(Protocol):
    @property
    def view(self) -> ClusterView: ...


class Books(Protocol):
    @property
    def store(self) -> BookingStore: ...


class HearsEvents(Protocol):
    """How far behind this replica is on live task events."""

    def events_behind(self) -> bool: ...


class Leases(Protocol):
    @property
    def lease_s(self) -> float: ...


class Keeps(Protocol):
    """How long a finished pipeline's record is kept."""

    @property
    def keep_s(self) -> float: ...


# -- siblings, as doors hold them ---------------------------------------------------------------


class HasCommits(Protocol):
    @property
    def commits(self) -> CommitsPort: ...


class HasDisplaced(Protocol):
    @property
    def displaced(self) -> DisplacedPort: ...


class HasFailover(Protocol):
    @property
    def failover(self) -> FailoverPort: ...


class HasPlacer(Protocol):
    @property
    def placer(self) -> PlacerPort: ...


class HasRecovery(Protocol):
    @property
    def recovery(self) -> RecoveryPort: ...


class HasWatchdog(Protocol):
    @property
    def watchdog(self) -> WatchdogPort: ...


class HasPredictor(Protocol):
    @property
    def predictor(self) -> Predictor: ...


# -- the doors ----------------------------------------------------------------------------------


class AdaptiveDoor(
    Clock, Spawns, Wakes, Bus, CancelsTasks, HoldsPipelines, SeesFleet, Books, HasPredictor,
    HasCommits, HasDisplaced, HasFailover, HasPlacer, HasRecovery, Protocol,
):  # fmt: skip
    """What adaptive re-scheduling reaches of the service."""


class CommitsDoor(
    Clock, Spawns, AsksAgents, TellsAgents, HearsEvents, HasFailover, HasWatchdog, Protocol
):
    """What commits reaches of the service."""

    @property
    def pipelines(self) -> dict[str, PipelineRun]: ...


class DisplacedDoor(
    Clock, Spawns, Wakes, Bus, AsksAgents, CancelsTasks, HoldsPipelines, SeesFleet, Books,
    HasCommits, HasFailover, HasPlacer, HasRecovery, HasWatchdog, Protocol,
):  # fmt: skip
    """What displaced-task handling reaches of the service."""

    @property
    def adaptive(self) -> AdaptivePort: ...


class FailoverDoor(
    Clock, Spawns, Wakes, Identity, Leases, Keeps, Bus, JetStream, HoldsPipelines, SeesFleet,
    Books, HasCommits, HasDisplaced, HasRecovery, HasWatchdog, Protocol,
):  # fmt: skip
    """What fail-over reaches of the service."""

    async def publish_pipeline(self, run: PipelineRun, recorded: bool = True) -> None: ...
    def remember(self, run: PipelineRun) -> None: ...
    async def on_task_event(self, msg: Msg) -> None: ...
    @property
    def queries(self) -> QueriesPort: ...
    @property
    def submissions(self) -> SubmissionsPort: ...


class PlacerDoor(
    Clock, Spawns, Identity, Leases, TellsAgents, CancelsTasks, SeesFleet, Books, HasPredictor,
    HasDisplaced, Protocol,
):  # fmt: skip
    """What placement reaches of the service."""

    @property
    def plan_budget_s(self) -> float: ...
    def wire_of(self, agent_id: str) -> int: ...
    async def offer_many(self, offers: Sequence[TaskOffer]) -> list[OfferReply]: ...
    def start_offers(self, offers: Sequence[TaskOffer]) -> asyncio.Future[list[OfferReply]]: ...


class QueriesDoor(
    Clock, Spawns, Identity, Bus, JetStream, CarriesEffects, SeesFleet, Books, HasFailover,
    Protocol,
):  # fmt: skip
    """What the API's queries reaches of the service."""

    @property
    def pipelines(self) -> dict[str, PipelineRun]: ...
    @property
    def replicas(self) -> ReplicasPort: ...


class RecoveryDoor(
    Clock, Spawns, Wakes, Identity, Keeps, Bus, JetStream, AsksAgents, TellsAgents,
    CancelsTasks, HoldsPipelines, CarriesEffects, SeesFleet, Books, HasCommits, HasDisplaced,
    HasFailover, HasPlacer, Protocol,
):  # fmt: skip
    """What recovery reaches of the service."""

    @property
    def cluster_changed(self) -> asyncio.Event: ...


class SubmissionsDoor(
    Clock, Spawns, Wakes, Identity, CancelsTasks, HoldsPipelines, CarriesEffects, SeesFleet,
    HasCommits, HasFailover, HasPlacer, Protocol,
):  # fmt: skip
    """What submissions reaches of the service."""

    def remember(self, run: PipelineRun) -> None: ...
    async def catch_up_events(self) -> bool: ...
    @property
    def cluster_changed(self) -> asyncio.Event: ...
    @property
    def stored(self) -> StoreLookup: ...


class WatchdogDoor(
    Spawns, Bus, AsksAgents, HearsEvents, HasCommits, HasFailover, HasRecovery, Protocol
):
    """What the watchdog reaches of the service."""

    def mono(self) -> float: ...
    @property
    def pipelines(self) -> dict[str, PipelineRun]: ...
    def events_backlog(self) -> int: ...
