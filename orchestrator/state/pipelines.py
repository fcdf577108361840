"""A pipeline's life on the orchestrator: a state machine fed with task events.

Events are applied at most once (by event id) and only under the token that placed the task, so
duplicates and results from stale placements never change the outcome.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from orchestrator.scheduling import Placement
from orchestrator.state.reads import StoreReads, store_reads
from schemas.api import (
    TASK_ENDED_STATES,
    TERMINAL_STATES,
    PipelineState,
    PipelineSummary,
    PlannedTask,
    StatusReply,
    TaskState,
    TaskStatus,
)
from schemas.events import TaskEvent
from schemas.pipeline import MediaType, PipelineSpec

MAX_SEEN_EVENTS = 100_000
#: Events of detached placements kept per pipeline (`PipelineRun.parked`).
MAX_PARKED = 256


@dataclass
class TaskRun:
    task_id: str
    state: TaskState = "pending"
    agent_id: str | None = None
    device_id: str | None = None
    token: int = 0
    started_s: float | None = None
    finished_s: float | None = None
    duration_s: float | None = None
    predicted_s: float | None = None
    #: the predictor's uncorrected estimate on the device it was placed on, when planned here
    #: (what a reported duration is learned against; None: ask the predictor again)
    base_s: float | None = None
    output_bytes: int = 0
    result: str = ""
    error: str = ""
    #: Its output (a success's): digest, media type, key in the outputs bucket.
    output_sha256: str | None = None
    output_type: MediaType | None = None
    output_key: str | None = None

    def status(self) -> TaskStatus:
        return TaskStatus(
            task_id=self.task_id,
            state=self.state,
            agent_id=self.agent_id,
            device_id=self.device_id,
            started_s=self.started_s,
            finished_s=self.finished_s,
            duration_s=self.duration_s,
            predicted_s=self.predicted_s,
            output_bytes=self.output_bytes,
            result=self.result,
            error=self.error,
            output_sha256=self.output_sha256,
            output_type=self.output_type,
            output_key=self.output_key,
        )


def ran_since(t: float, ev: TaskEvent) -> float:
    """When (run clock) the task began, by the time it says it has run: a `started` event is
    sent a while into the run, and a short task's end event is the only one. An ONNX run's
    end says its model's load apart from its run time: both were spent on the run."""
    return max(0.0, t - (ev.duration_s or 0.0) - (ev.load_s or 0.0))


@dataclass
class PipelineRun:
    pipeline_id: str
    spec: PipelineSpec
    submitted_at: float
    state: PipelineState = "pending"
    reason: str = ""
    algorithm: str = ""
    planned_makespan_s: float = 0.0
    #: What the current plan is predicted to cost (dollars).
    planned_cost: float = 0.0
    plan: list[PlannedTask] = field(default_factory=list)
    committed_at: float | None = None
    finished_at: float | None = None
    tasks: dict[str, TaskRun] = field(default_factory=dict)
    seen_events: set[str] = field(default_factory=set)
    stale_events: int = 0
    duplicate_events: int = 0
    #: Booking clock (wall) at submission and at the plan's time zero.
    submitted_wall: float = 0.0
    t0: float = 0.0
    owner: str = ""
    placements: dict[str, Placement] = field(default_factory=dict)
    placement_log: list[str] = field(default_factory=list)
    conflicts: int = 0
    rejections: int = 0
    cas_retries: int = 0
    #: Seconds the last placement spent per step (plan, book, offer), summed over its rounds,
    #: and the portfolio budget of its last plan (`budget`).
    step_s: dict[str, float] = field(default_factory=dict)
    #: Exactly once (see reliability/results.py) and recoveries (reliability/recovery.py).
    results_committed: int = 0
    results_dropped: int = 0
    recoveries: int = 0
    #: Terminal, and that final state persisted (what in-process waiters wait for).
    settled: bool = False
    #: Each task's reservation as booked by this replica: (device key, start, end). A task that
    #: ended gives exactly that window back (a later booking of it keeps its own).
    windows: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    #: Per task, how many of its windows evictions took: booked into its later windows,
    #: each eviction ranks them higher (`reservations.book.EVICTION_POINTS`).
    evictions: dict[str, int] = field(default_factory=dict)
    #: Tasks a re-placement under way has taken from their placement: (agent, token) of that
    #: placement. Events of it are stale while it runs, and kept (`parked`), for should the
    #: re-placement fail and put the placement back, they are its own again.
    detached: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    parked: list[TaskEvent] = field(default_factory=list)
    #: Per task, the tokens of its runs whose success was applied: an output of one of those
    #: is its committed output (a task run again keeps the first as committed, see results).
    succeeded_tokens: dict[str, set[int]] = field(default_factory=dict)
    #: Results refused because a task ran on an output of a superseded producer run.
    results_voided: int = 0
    #: The size of each artifact its tasks name, by sha256, as the store said at submission
    #: (what the plan charges agents without it; unknown: not charged).
    artifact_sizes: dict[str, int] = field(default_factory=dict)
    _reads: StoreReads | None = field(default=None, init=False, repr=False)

    @property
    def reads(self) -> StoreReads:
        """What its tasks fetch from the object store, for the plan to charge."""
        if self._reads is None:
            self._reads = store_reads(self.spec, self.artifact_sizes)
        return self._reads

    def measured_bytes(self) -> dict[str, int]:
        """The output size of each task that succeeded, as its agent measured it."""
        return {t: tr.output_bytes for t, tr in self.tasks.items() if tr.state == "succeeded"}

    def __post_init__(self) -> None:
        if not self.tasks:
            self.tasks = {t.id: TaskRun(t.id) for t in self.spec.tasks}
        self.spec_by_id = {t.id: t for t in self.spec.tasks}
        self.index = {t.id: i for i, t in enumerate(self.spec.tasks)}
        self.children: dict[str, list[str]] = {t.id: [] for t in self.spec.tasks}
        for t in self.spec.tasks:
            for d in t.deps:
                self.children[d].append(t.id)

    def note(self, line: str) -> None:
        if len(self.placement_log) < 500:
            self.placement_log.append(line[:2048])

    def devices(self) -> set[str]:
        """Scheduler ids (agent:device) of every device this pipeline holds windows on."""
        return {p.device_id for p in self.placements.values()}

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def _clock(self, now: float) -> float:
        return max(0.0, now - (self.committed_at if self.committed_at is not None else now))

    def apply(self, ev: TaskEvent, now: float) -> PipelineState | None:
        """Apply one task event; returns the new pipeline state when it changed."""
        task = self.tasks.get(ev.task_id)
        if ev.event_id in self.seen_events and not self._wound_back(ev):
            self.duplicate_events += 1
            return None
        if task is None or task.agent_id != ev.agent_id or task.token != ev.token:
            kept = task is not None and self.detached.get(ev.task_id) == (ev.agent_id, ev.token)
            if kept and len(self.parked) < MAX_PARKED and ev not in self.parked:
                self.parked.append(ev)
            self.stale_events += 1
            return None
        if len(self.seen_events) < MAX_SEEN_EVENTS:
            self.seen_events.add(ev.event_id)
        if self.terminal or task.state in TASK_ENDED_STATES:
            return None
        t = self._clock(now)
        if ev.state == "accepted":
            if task.state in ("pending", "offered"):  # a replayed event never winds a task back
                task.state = "accepted"
        elif ev.state == "started":
            if task.state != "started":  # a replayed start keeps the first start time
                task.started_s = ran_since(t, ev)
                self._causal(ev.task_id)
            task.state = "started"
        elif ev.state in TASK_ENDED_STATES:
            if ev.state == "succeeded":
                self.succeeded_tokens.setdefault(ev.task_id, set()).add(ev.token)
            task.state = ev.state
            task.finished_s = t
            if task.started_s is None:  # a short task is reported once, when it ends
                task.started_s = ran_since(t, ev)
            task.duration_s = ev.duration_s
            task.output_bytes = ev.output_bytes
            task.result = ev.result
            task.error = ev.error
            task.output_sha256, task.output_type = ev.output_sha256, ev.output_type
            task.output_key = ev.output_key
            self._causal(ev.task_id)
        before = self.state
        if ev.state == "failed":
            self.finish("failed", f"task {ev.task_id} failed on {ev.agent_id}: {ev.error}", now)
        else:
            self.settle(now)
        return self.state if self.state != before else None

    def _wound_back(self, ev: TaskEvent) -> bool:
        """An end event heard before, of the task's current placement, while the task is not
        ended: a re-placement that ran meanwhile put the task back as it was before the end
        (its agent, asked, sends the end again). Applied again, or nothing would end it."""
        task = self.tasks.get(ev.task_id)
        return (
            ev.state in TASK_ENDED_STATES and task is not None and not self.terminal
            and task.state not in TASK_ENDED_STATES
            and task.agent_id == ev.agent_id and task.token == ev.token
        )  # fmt: skip

    def superseded_inputs(self, ev: TaskEvent) -> dict[str, int]:
        """Inputs a task's end says it ran on that are not its producers' committed output:
        producer -> the token it ran on. A run counts as committed when its success was
        applied here, or when it is the producer's current placement (its end may simply not
        be heard yet: no consumer can hold its output before it ran). Empty when the event
        names no tokens (an agent of an older release)."""
        if ev.input_tokens is None:
            return {}
        spec = self.spec_by_id.get(ev.task_id)
        if spec is None:
            return {}
        out: dict[str, int] = {}
        for d in spec.deps:
            token = ev.input_tokens.get(d, 0)
            producer = self.tasks[d]
            if token != producer.token and token not in self.succeeded_tokens.get(d, ()):
                out[d] = token
        return out

    def void(self, ev: TaskEvent, superseded: dict[str, int], now: float) -> bool:
        """A success of the current placement computed on superseded inputs: not committed;
        the task is left `cancelled`, to be placed again. False if the event would not apply
        anyway (a duplicate, another placement's, or the task or pipeline ended)."""
        task = self.tasks.get(ev.task_id)
        if (
            ev.event_id in self.seen_events
            or task is None or task.agent_id != ev.agent_id or task.token != ev.token
            or self.terminal or task.state in TASK_ENDED_STATES
        ):  # fmt: skip
            return False
        if len(self.seen_events) < MAX_SEEN_EVENTS:
            self.seen_events.add(ev.event_id)
        ran = ", ".join(
            f"{d} under token {t} (its run is {self.tasks[d].token})"
            for d, t in sorted(superseded.items())
        )
        task.state = "cancelled"
        task.error = f"ran on a superseded output of {ran}: run again"[:2048]
        self.results_voided += 1
        self.results_dropped += 1
        self.note(f"{ev.task_id} on {ev.agent_id}: {task.error}")
        return True

    def settle(self, now: float) -> bool:
        """End the pipeline as succeeded if every task has: `apply`'s rule, also for task
        states put back outside it (a re-placement that failed restores what it took, and
        the last of the others may have ended meanwhile). True if it ended here."""
        if self.terminal or not all(tr.state == "succeeded" for tr in self.tasks.values()):
            return False
        self.finish("succeeded", "", now)
        return True

    def stalled(self, now: float, after_s: float, only: Collection[str] | None = None) -> list[str]:
        """Tasks committed and free to start (every input's producer succeeded, and their
        planned start, which counts the queue on their device, has come) that have not been
        reported started for more than `after_s` since; of `only` these, when given."""
        if self.terminal or self.committed_at is None:
            return []
        t = self._clock(now)
        out = []
        for spec in self.spec.tasks:
            if self.tasks[spec.id].state != "accepted" or (
                only is not None and spec.id not in only
            ):
                continue
            deps = [self.tasks[d] for d in spec.deps]
            if any(d.state != "succeeded" for d in deps):
                continue
            planned = self.placements.get(spec.id)
            free_since = max(
                [d.finished_s or 0.0 for d in deps] + [planned.start if planned else 0.0]
            )
            if t - free_since > after_s:
                out.append(spec.id)
        return out

    def overdue(self, now: float, after_s: float, factor: float) -> list[str]:
        """Tasks reported started whose end has not been reported `after_s` plus `factor`
        times their predicted duration after their start (a long task is not late by this
        rule; a lost end event is)."""
        if self.terminal or self.committed_at is None:
            return []
        t = self._clock(now)
        return [
            tid for tid, tr in self.tasks.items()
            if tr.state == "started" and tr.started_s is not None
            and t - tr.started_s > after_s + factor * (tr.predicted_s or 0.0)
        ]  # fmt: skip

    def _causal(self, task_id: str) -> None:
        """Times here are when events were heard, each late by its agent's link: a consumer
        heard starting before its producer was heard ending did start after that end (it had
        the input). Its producers' ends are dated back to its start, and its consumers' starts
        forward to its end, so a timeline never shows a consumer running before its input was
        made."""
        tr = self.tasks[task_id]
        if tr.started_s is not None:
            for d in self.spec_by_id[task_id].deps:
                dep = self.tasks[d]
                if dep.finished_s is not None and dep.finished_s > tr.started_s:
                    dep.finished_s = tr.started_s
                    if dep.started_s is not None:
                        dep.started_s = min(dep.started_s, dep.finished_s)
        if tr.finished_s is not None:
            for c in self.children[task_id]:
                child = self.tasks[c]
                if child.started_s is not None and child.started_s < tr.finished_s:
                    tr.finished_s = child.started_s
            if tr.started_s is not None:
                tr.started_s = min(tr.started_s, tr.finished_s)

    def finish(self, state: PipelineState, reason: str, now: float) -> None:
        """End the pipeline; a task that did not end ends `cancelled` with it (it will not
        run, and its agents are told so), not left `started` or `accepted` for good."""
        self.state = state
        self.reason = reason
        self.finished_at = now
        if state != "succeeded":
            for tr in self.tasks.values():
                if tr.state not in TASK_ENDED_STATES:
                    tr.state = "cancelled"
                    if not tr.error:
                        tr.error = f"the pipeline {state}"

    def status(self, now: float) -> StatusReply:
        end = self.finished_at if self.finished_at is not None else now
        start = self.committed_at if self.committed_at is not None else self.submitted_at
        return StatusReply(
            pipeline_id=self.pipeline_id,
            name=self.spec.name,
            state=self.state,
            reason=self.reason[:2048],
            algorithm=self.algorithm,
            planned_makespan_s=self.planned_makespan_s,
            planned_cost=self.planned_cost,
            elapsed_s=max(0.0, end - start),
            plan=self.plan,
            tasks=[self.tasks[t.id].status() for t in self.spec.tasks],
            placement_log=list(self.placement_log),
            owner=self.owner[:256],
            conflicts=self.conflicts,
            rejections=self.rejections,
            cas_retries=self.cas_retries,
            prediction_error_pct=self.prediction_error_pct(),
            duplicate_events=min(self.duplicate_events, 1 << 31),
            stale_events=min(self.stale_events, 1 << 31),
            results_committed=self.results_committed,
            results_dropped=self.results_dropped,
            recoveries=self.recoveries,
        )

    def prediction_error_pct(self) -> float | None:
        """How far the plan's task times were from the measured ones: the sum of |predicted -
        ran| over the succeeded tasks, as a percentage of the sum of their run times. A mean
        of per-task ratios let one task of a few microseconds (an accelerator's) read as
        thousands of percent however close the rest were."""
        pairs = [
            (tr.predicted_s, tr.duration_s)
            for tr in self.tasks.values()
            if tr.state == "succeeded" and tr.predicted_s is not None and tr.duration_s is not None
        ]
        ran = sum(d for _, d in pairs)
        if not pairs or ran <= 0.0:
            return None
        return 100.0 * sum(abs(p - d) for p, d in pairs) / ran

    def summary(self, submitted: float | None = None) -> PipelineSummary:
        return PipelineSummary(
            pipeline_id=self.pipeline_id,
            name=self.spec.name,
            state=self.state,
            tasks=len(self.tasks),
            submitted=submitted,
            owner=self.owner[:256],
        )
