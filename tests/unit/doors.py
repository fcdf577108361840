"""Stand-ins for the service behind a collaborator's door (orchestrator/ports.py), for unit
tests with no NATS: each has its door's members (mypy checks them against the protocol where
a test hands one to a collaborator) and keeps what the collaborator asked of the service.
Clocks move only when a test moves them; whatever is spawned runs when a test `settle`s it.
A port member a test does not expect the collaborator to reach raises, so reaching it fails
the test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NATS

from orchestrator.ports import AskKind, CommitsPort, FailoverPort, M, RecoveryPort, WatchdogPort
from orchestrator.reliability.results import ResultLedger
from orchestrator.state.pipelines import PipelineRun
from schemas.api import StatusReply, SubmitReply
from schemas.base import WireModel
from schemas.codec import Encoding
from schemas.pipeline import PipelineSpec


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

    def mono(self) -> float:
        return self.now

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(coro)
        self.spawned.append(task)
        return task

    async def settle(self) -> None:
        """Run everything spawned (and what that spawns) to its end; raises what it raised."""
        while pending := [t for t in self.spawned if not t.done()]:
            await asyncio.gather(*pending)
        for t in self.spawned:
            t.result()  # an error in one fails the test

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

    def events_behind(self) -> bool:
        return self.behind


class CommitsService(_Service):
    """The service as commits sees it (`CommitsDoor`)."""

    def __init__(self, now: float = 1000.0, answer: Answer = no_answer) -> None:
        super().__init__(now, answer)
        self.watchdog = WatchdogAsks()

    def wall(self) -> float:
        return self.wall_offset + self.now

    async def tell_agent(
        self,
        subject_of: Callable[[str], str],
        agent_id: str,
        msg: WireModel,
        *,
        encoding: Encoding = "msgpack",
    ) -> None:
        self.sent.append(Sent(subject_of(agent_id), agent_id, msg, asked=False))


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


async def turns(n: int = 10) -> None:
    """Let other tasks run `n` turns of the event loop (no time passes)."""
    for _ in range(n):
        await asyncio.sleep(0)


def _doors_opened() -> None:
    """Never called: mypy checks here that each stand-in opens its door (and each port)."""
    from orchestrator.ports import CommitsDoor, WatchdogDoor

    _c: CommitsDoor = CommitsService()
    _w: WatchdogDoor = WatchdogService()
    _f: FailoverPort = Failover()
    _r: RecoveryPort = Recovery()
    _cp: CommitsPort = CommitsAsks()
    _wp: WatchdogPort = WatchdogAsks()
