"""A pipeline's life as one pure state machine: stimuli in, effects out.

The async shells (submissions, the event path, recovery, cancel) hand `step` what they heard
or decided and carry out the effects it returns, in order; none of them changes a pipeline's
state, its tasks' states, placements or tokens any other way. Nothing here does I/O or reads
a clock: `now` comes with each step, so every transition can be replayed in a unit test.
Counters (conflicts, results committed) and the booking ledger (`PipelineRun.windows`) are
bookkeeping, kept by the shell that does the counting or booking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun
from schemas.api import TASK_ENDED_STATES, PipelineState, PlannedTask, TaskState
from schemas.events import TaskEvent

# -- stimuli ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placing:
    """A placement of the whole pipeline begins (submitted, or adopted with no record)."""

    why: str = ""


@dataclass(frozen=True)
class BoundTask:
    agent_id: str
    device_id: str
    token: int
    predicted_s: float
    base_s: float | None


@dataclass(frozen=True)
class Bound:
    """A placement's offers were all accepted: the plan is the pipeline's; `tasks` are the
    tasks it placed (a re-placement's producers only told where consumers went are not)."""

    placements: Mapping[str, Placement]
    plan: list[PlannedTask]
    algorithm: str
    tasks: Mapping[str, BoundTask]
    #: What the whole plan is predicted to cost (dollars).
    cost: float = 0.0


@dataclass(frozen=True)
class Committed:
    """The first placement is booked, accepted and answered for: the pipeline runs."""


@dataclass(frozen=True)
class NotPlaced:
    unschedulable: bool
    reason: str


@dataclass(frozen=True)
class Heard:
    """A task event of this pipeline, live or replayed (the shell fences events of
    pipelines it may not act on)."""

    ev: TaskEvent


@dataclass(frozen=True)
class CancelAsked:
    reason: str


@dataclass(frozen=True)
class GaveUp:
    """Recovery found no room for the pipeline's tasks for too long."""

    reason: str


@dataclass(frozen=True)
class Detached:
    """A re-placement takes `tasks` from their placements: events of those placements are
    stale while it runs, and kept, should it fail."""

    tasks: frozenset[str]


@dataclass(frozen=True)
class Replaced:
    """The re-placement of `tasks` is over: placed anew (or cancelled), their old
    placements' events stay stale."""

    tasks: frozenset[str]


@dataclass(frozen=True)
class PutBack:
    """A re-placement failed: its tasks as they were before `Detached` (state, agent,
    token)."""

    saved: Mapping[str, tuple[TaskState, str | None, int]]
    why: str


@dataclass(frozen=True)
class AgentLost:
    """An agent was declared dead (this incarnation of it)."""

    agent_id: str
    incarnation: str
    cause: str


@dataclass(frozen=True)
class LeaseLost:
    """Another replica owns the pipeline now; `end_recorded`: its end here was written."""

    owner: str
    why: str
    end_recorded: bool


Stimulus = (
    Placing | Bound | Committed | NotPlaced | Heard | CancelAsked | GaveUp | Detached
    | Replaced | PutBack | AgentLost | LeaseLost
)  # fmt: skip

# -- effects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommitTasks:
    """Send the commit that starts these tasks (looked after until each agent has it)."""

    tasks: frozenset[str]


@dataclass(frozen=True)
class GiveBack:
    """A task ended while the pipeline runs on: give its window back now."""

    task_id: str


@dataclass(frozen=True)
class RunAgain:
    """Place a task again (with what must run again to feed it)."""

    task_id: str
    why: str


@dataclass(frozen=True)
class RePlace:
    """Re-place the unfinished tasks on the `gone` agents, and whatever must run again to
    feed what still has to run (outputs held there are lost)."""

    gone: frozenset[str]
    incarnations: Mapping[str, str]
    why: str


@dataclass(frozen=True)
class PassCancel:
    """A cancel heard here while the lease had lapsed: pass it to the pipeline's owner."""


@dataclass(frozen=True)
class CommitResult:
    """Record a success as the task's result, exactly once."""

    ev: TaskEvent


@dataclass(frozen=True)
class Learn:
    """Feed a measured run time to the predictor."""

    ev: TaskEvent


@dataclass(frozen=True)
class ProducerEnded:
    task_id: str


@dataclass(frozen=True)
class HoldStarted:
    """A task started: its window is no longer for others to take."""

    task_id: str
    token: int


@dataclass(frozen=True)
class CancelOnAgents:
    reason: str


@dataclass(frozen=True)
class SettleResults:
    """The pipeline ended: write its gathered result commits before its end is recorded."""


@dataclass(frozen=True)
class Close:
    """The pipeline ended: give back every window, record the end, then publish it."""


@dataclass(frozen=True)
class Publish:
    """Tell the pipeline's (non-terminal) state."""


@dataclass(frozen=True)
class Record:
    """Persist the pipeline's record (what an adopting replica resumes from)."""


@dataclass(frozen=True)
class Progress:
    """A task finished: what a new owner would resume from moved on."""


@dataclass(frozen=True)
class HearAgain:
    """Events kept while their placements were detached, to go through the event path."""

    events: tuple[TaskEvent, ...] = field(default=())


@dataclass(frozen=True)
class Changed:
    """Wake whoever waits on the pipeline's state."""


Effect = (
    CommitTasks | GiveBack | RunAgain | RePlace | PassCancel | CommitResult | Learn
    | ProducerEnded | HoldStarted | CancelOnAgents | SettleResults | Close | Publish | Record
    | Progress | HearAgain | Changed
)  # fmt: skip


# -- the machine --------------------------------------------------------------------------------


def step(run: PipelineRun, stimulus: Stimulus, now: float) -> list[Effect]:
    """Apply one stimulus to `run` (monotonic `now`); returns what the shell must do, in
    order."""
    match stimulus:
        case Heard(ev):
            return _heard(run, ev, now)
        case Placing(why):
            run.state = "placing"
            if why:
                run.note(why)
            return []
        case Bound():
            _bind(run, stimulus)
            return []
        case Committed():
            run.committed_at = now
            run.state = "running"
            return [CommitTasks(frozenset(run.tasks)), Publish(), Record()]
        case NotPlaced(unschedulable, reason):
            if run.terminal:
                return []
            run.finish("unschedulable" if unschedulable else "failed", reason, now)
            return [Close()]
        case CancelAsked(reason):
            return _end(run, "cancelled", reason or "cancelled by request", now)
        case GaveUp(reason):
            return _end(run, "failed", reason, now)
        case Detached(tasks):
            for t in tasks:
                tr = run.tasks[t]
                run.detached[t] = (tr.agent_id, tr.token)  # its events kept, should this fail
                tr.state, tr.agent_id, tr.token = "pending", None, 0  # its old events: stale
            return []
        case Replaced(tasks):
            _undetach(run, tasks)
            return []
        case PutBack(saved, why):
            return _put_back(run, saved, why, now)
        case AgentLost(agent, incarnation, cause):
            # what it ran, or holds outputs of, is placed again; a pipeline with nothing
            # there (or ended) is not this agent's business
            if run.terminal or all(tr.agent_id != agent for tr in run.tasks.values()):
                return []
            why = f"agent {agent} dead ({cause})"
            return [RePlace(frozenset({agent}), {agent: incarnation}, why)]
        case LeaseLost(owner, why, end_recorded):
            run.note(f"{owner} lost the ownership lease ({why})")
            # cancelled here while the lease had lapsed: the adopter resumed it running
            return [PassCancel()] if run.state == "cancelled" and not end_recorded else []
    raise TypeError(f"not a pipeline stimulus: {stimulus!r}")


def _end(run: PipelineRun, state: PipelineState, reason: str, now: float) -> list[Effect]:
    """Ended from outside its tasks: what still runs of it is told to stop."""
    if run.terminal:
        return []
    run.finish(state, reason, now)
    return [CancelOnAgents(run.reason), Close(), Changed()]


def _bind(run: PipelineRun, b: Bound) -> None:
    run.placements = dict(b.placements)
    run.plan = b.plan
    run.algorithm = b.algorithm
    run.planned_makespan_s = max((p.finish for p in b.placements.values()), default=0.0)
    run.planned_cost = b.cost
    for tid, x in b.tasks.items():
        tr = run.tasks[tid]
        tr.agent_id, tr.device_id, tr.token = x.agent_id, x.device_id, x.token
        tr.predicted_s, tr.base_s = x.predicted_s, x.base_s
        tr.state = "accepted"


def _heard(run: PipelineRun, ev: TaskEvent, now: float) -> list[Effect]:
    if ev.state == "succeeded" and ev.input_tokens is not None:
        superseded = run.superseded_inputs(ev)
        if superseded and run.void(ev, superseded, now):
            # its inputs were not its producers' committed outputs: never committed, run
            # again on them (placed like a task its agent gave up)
            tid = ev.task_id
            return [GiveBack(tid), RunAgain(tid, f"{tid} ran on a superseded input")]
    task = run.tasks.get(ev.task_id)
    was = (task.state, task.started_s, task.finished_s) if task is not None else None
    new_state = run.apply(ev, now)
    # news only if it changed the task: a duplicate, an old placement's event, or another
    # report of an end already heard is not learned from or committed twice
    fresh = task is not None and (task.state, task.started_s, task.finished_s) != was
    out: list[Effect] = []
    if ev.state in TASK_ENDED_STATES and new_state is None:
        out.append(GiveBack(ev.task_id))
    if fresh and ev.state == "succeeded":
        out.append(CommitResult(ev))
    elif fresh and ev.state == "cancelled" and not run.terminal:
        # the agent gave the task up on its own (drain deadline, shutdown): run it elsewhere
        why = f"{ev.agent_id} cancelled {ev.task_id} itself ({ev.error or 'no reason'})"
        out.append(RunAgain(ev.task_id, why))
    if run.terminal:
        out.append(SettleResults())
    if fresh and ev.state == "succeeded":
        out += [Learn(ev), ProducerEnded(ev.task_id)]
    elif fresh and ev.state == "started":
        out.append(HoldStarted(ev.task_id, ev.token))
    if new_state is not None:
        if new_state == "failed":
            out.append(CancelOnAgents(run.reason))
        out.append(Close())
    elif ev.state == "succeeded":
        out.append(Progress())
    out.append(Changed())
    return out


def _undetach(run: PipelineRun, tasks: frozenset[str]) -> list[TaskEvent]:
    for t in tasks:
        run.detached.pop(t, None)
    kept = [ev for ev in run.parked if ev.task_id in tasks]
    run.parked = [ev for ev in run.parked if ev.task_id not in tasks]
    return kept


def _put_back(
    run: PipelineRun,
    saved: Mapping[str, tuple[TaskState, str | None, int]],
    why: str,
    now: float,
) -> list[Effect]:
    for t, (state, agent, token) in saved.items():
        tr = run.tasks[t]
        tr.state, tr.agent_id, tr.token = state, agent, token
    # what their agents said of them meanwhile is about the placements put back: heard again
    # (an end dropped as stale left its task waiting on a placement that had ended)
    kept = _undetach(run, frozenset(saved))
    out: list[Effect] = []
    if kept and not run.terminal:
        run.stale_events = max(0, run.stale_events - len(kept))
        out.append(HearAgain(tuple(kept)))
    if run.settle(now):
        # a finished producer it was to run again, and what waited for it, ended meanwhile:
        # nothing is left to run, and no event would end the pipeline any more
        run.note(f"{why}: every task has succeeded meanwhile; nothing to re-run")
        out.append(Close())
    return out
