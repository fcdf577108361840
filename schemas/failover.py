"""Orchestrator fail-over state in JetStream KV: who owns a pipeline, and what it takes to resume.

`OwnerLease` lives in bucket `MARS_OWNERS` under the pipeline id; `PipelineRecord` (everything a
replica needs to finish a pipeline it did not start) and the pipeline's spec live in
`MARS_RUNS` under `run.<pipeline>` and `spec.<pipeline>`. The public `StatusReply` in
`MARS_PIPELINES` is unchanged by this.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.api import PipelineState, PlannedTask, TaskStatus
from schemas.base import WireModel
from schemas.bookings import Instant
from schemas.limits import MAX_TASKS, Count, Ident, NonNegFloat, ShortText, Text

#: Seconds relative to the plan's time zero; finite and bounded either way.
PlanTime = Annotated[float, Field(ge=-1e9, le=1e9, allow_inf_nan=False)]

OWNERS_BUCKET = "MARS_OWNERS"
RUNS_BUCKET = "MARS_RUNS"


def run_key(pipeline_id: str) -> str:
    return f"run.{pipeline_id}"


def spec_key(pipeline_id: str) -> str:
    return f"spec.{pipeline_id}"


class OwnerLease(WireModel):
    """A replica drives a pipeline until `expires` (booking clock) unless it renews; `epoch`
    grows with every change of owner and fences the writes of a replica that lost it."""

    pipeline_id: Ident
    owner: ShortText
    expires: Instant
    epoch: Annotated[int, Field(ge=1, le=1 << 53)]


class PlacedTask(WireModel):
    """One scheduler placement (device id is `agent:device`), times after the plan's `t0`."""

    task_id: Ident
    device_id: Annotated[str, Field(min_length=1, max_length=300)]
    slot: Annotated[int, Field(ge=0, le=1024)]
    start: PlanTime
    finish: PlanTime


class TaskRecord(WireModel):
    status: TaskStatus
    #: Fencing token of the task's current placement (0: not placed).
    token: Count = 0


class PipelineRecord(WireModel):
    """A pipeline's resumable state. Times on the orchestrator's monotonic clock are stored as
    booking-clock instants (`*_wall`), so another replica can map them onto its own clock."""

    pipeline_id: Ident
    name: Ident
    owner: ShortText
    epoch: Annotated[int, Field(ge=1, le=1 << 53)]
    state: PipelineState
    reason: Text = ""
    algorithm: ShortText = ""
    planned_makespan_s: NonNegFloat = 0.0
    plan: Annotated[list[PlannedTask], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    placements: Annotated[list[PlacedTask], Field(max_length=MAX_TASKS)] = Field(
        default_factory=list
    )
    tasks: Annotated[list[TaskRecord], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    placement_log: Annotated[list[Text], Field(max_length=500)] = Field(default_factory=list)
    submitted_wall: Instant = 0.0
    t0: Instant = 0.0
    committed_wall: Instant | None = None
    finished_wall: Instant | None = None
    conflicts: Count = 0
    rejections: Count = 0
    cas_retries: Count = 0
    stale_events: Count = 0
    duplicate_events: Count = 0
    #: Other per-pipeline counters (exactly-once results, recoveries) to carry on from.
    counters: Annotated[dict[Ident, Count], Field(max_length=32)] = Field(default_factory=dict)
    #: Task events up to this `MARS_EVENTS` sequence are known applied (0: replay them all).
    events_seq: Count = 0
    #: How many times another replica took this pipeline over.
    adoptions: Count = 0
    #: Per task, how many of its windows evictions took (its next windows rank higher).
    evictions: Annotated[
        dict[Ident, Annotated[int, Field(ge=0, le=1000)]], Field(max_length=MAX_TASKS)
    ] = Field(default_factory=dict)


class ReplicaHello(WireModel):
    """An orchestrator replica says it is up (at start and every few seconds) or leaving; one
    that hears a newcomer (`answer`) says hello back, so every replica knows the others (a
    `list` asks each of them)."""

    owner: Ident
    leaving: bool = False
    answer: bool = False
