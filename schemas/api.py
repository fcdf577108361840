"""Requests and replies of the orchestrator's API service."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import WireModel
from schemas.bookings import Instant
from schemas.events import OutputKey
from schemas.limits import MAX_TASKS, Bytes, Ident, NonNegFloat, ShortText, Text
from schemas.pipeline import MediaType, PipelineSpec
from schemas.placement import Sha256

PipelineState = Literal[
    "pending", "placing", "running", "succeeded", "failed", "cancelled", "unschedulable"
]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "unschedulable"})
TaskState = Literal["pending", "offered", "accepted", "started", "succeeded", "failed", "cancelled"]
#: A task in one of these will not run (again) under its current placement.
TASK_ENDED_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class SubmitRequest(WireModel):
    pipeline: PipelineSpec
    #: Chosen by the client to make a retried submit idempotent.
    pipeline_id: Ident | None = None
    #: How long the client waits for the reply. A submission still waiting to be served when
    #: (nearly) that has passed is answered `unavailable` and not placed: its client has given
    #: up, and placing it would start a pipeline nobody heard of (one submitted again without
    #: an id would then run twice).
    timeout_ms: Annotated[int, Field(ge=1, le=3_600_000)] | None = None


class PlannedTask(WireModel):
    task_id: Ident
    agent_id: Ident
    device_id: Ident
    slot: Annotated[int, Field(ge=0, le=1024)]
    start_s: NonNegFloat
    finish_s: NonNegFloat


class SubmitReply(WireModel):
    pipeline_id: Ident
    state: PipelineState
    algorithm: ShortText
    makespan_s: NonNegFloat
    plan: Annotated[list[PlannedTask], Field(max_length=MAX_TASKS)]
    #: What the plan is predicted to cost, in dollars (device time at each device's $/hour,
    #: data crossing sites at each link's $/GB); 0 where nothing is priced.
    cost: NonNegFloat = 0.0


class StatusRequest(WireModel):
    pipeline_id: Ident


class TaskStatus(WireModel):
    task_id: Ident
    state: TaskState
    agent_id: Ident | None = None
    device_id: Ident | None = None
    #: Orchestrator-clock seconds since the pipeline was committed (never an agent's clock).
    started_s: NonNegFloat | None = None
    finished_s: NonNegFloat | None = None
    #: Measured by the agent on its own monotonic clock.
    duration_s: NonNegFloat | None = None
    predicted_s: NonNegFloat | None = None
    output_bytes: Bytes = 0
    result: ShortText = ""
    error: Text = ""
    #: Its output (a success's): digest, media type, and key in the outputs bucket
    #: (`mars get PIPELINE TASK` reads it from there; None: not kept, e.g. synthetic).
    output_sha256: Sha256 | None = None
    output_type: MediaType | None = None
    output_key: OutputKey | None = None


class StatusReply(WireModel):
    pipeline_id: Ident
    name: Ident
    state: PipelineState
    reason: Text = ""
    algorithm: ShortText = ""
    planned_makespan_s: NonNegFloat = 0.0
    #: What its current plan is predicted to cost, in dollars (as `SubmitReply.cost`).
    planned_cost: NonNegFloat = 0.0
    elapsed_s: NonNegFloat = 0.0
    plan: Annotated[list[PlannedTask], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    tasks: Annotated[list[TaskStatus], Field(max_length=MAX_TASKS)] = Field(default_factory=list)
    #: Every conflict, rejection and eviction met while placing, with its reason.
    placement_log: Annotated[list[Text], Field(max_length=500)] = Field(default_factory=list)
    owner: ShortText = ""
    conflicts: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    rejections: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    cas_retries: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    #: Sum of |predicted - actual| over succeeded tasks, as a percentage of the sum of their
    #: actual run times; None before any.
    prediction_error_pct: NonNegFloat | None = None
    #: Exactly once: task events dropped as repeats or as coming from a superseded placement,
    #: results committed (once per task, by CAS in KV `MARS_RESULTS`) and results dropped there.
    duplicate_events: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    stale_events: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    results_committed: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    results_dropped: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    #: Times tasks were re-placed after their agent died or cancelled them itself.
    recoveries: Annotated[int, Field(ge=0, le=1 << 31)] = 0


class ListRequest(WireModel):
    state: PipelineState | None = None
    limit: Annotated[int, Field(ge=1, le=1000)] = 100
    #: The page: this many of the newest (of `state`, when given) are skipped.
    offset: Annotated[int, Field(ge=0, le=1 << 31)] = 0
    #: Only this user's pipelines (`PipelineSpec.user`). On a user's own subject
    #: (`mars.v1.api.list.<user>`) it is that user, whatever the request says.
    user: Ident | None = None


class PipelineSummary(WireModel):
    pipeline_id: Ident
    name: Ident
    state: PipelineState
    tasks: Annotated[int, Field(ge=0, le=MAX_TASKS)]
    #: When it was submitted, on the booking clock (Unix seconds): replicas' lists merge by it.
    submitted: Instant | None = None
    #: The replica holding it (the one whose list it came from).
    owner: ShortText = ""


class ListReply(WireModel):
    """A page of the pipelines whose records are kept (`MARS_RUNS`, whichever replica wrote
    them), each as the replica holding it knows it, newest first."""

    pipelines: Annotated[list[PipelineSummary], Field(max_length=1000)]
    #: Replicas known to be up that did not answer in time: what they know since their last
    #: record writes is missing (`MARS_RUNS` here: the records could not be read, and only
    #: what replicas hold in memory is listed).
    unanswered: Annotated[list[Ident], Field(max_length=64)] = Field(default_factory=list)
    #: How many pipelines there are (of the request's `state`), this page and the others.
    total: Annotated[int, Field(ge=0, le=1 << 31)] = 0


class CancelRequest(WireModel):
    pipeline_id: Ident
    reason: ShortText = ""


class CancelReply(WireModel):
    pipeline_id: Ident
    state: PipelineState


class AgentsRequest(WireModel):
    alive_only: bool = False


class DeviceQueue(WireModel):
    """One device's booking key as the answering replica's planning sees it."""

    device_id: Ident
    #: Windows booked, less the replica's releases not yet written (expired ones too, until
    #: the key's next write drops them).
    windows: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    key_bytes: Annotated[int, Field(ge=0, le=1 << 32)] = 0
    #: At the replica's size limit with its unexpired windows alone: the device takes no new
    #: bookings (docs/operations.md).
    full: bool = False


class AgentSummary(WireModel):
    agent_id: Ident
    incarnation: Ident
    site: Ident
    tier: ShortText
    alive: bool
    devices: Annotated[list[ShortText], Field(max_length=64)]
    running: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    #: Seconds since the answering replica last heard from it (its advert or a heartbeat).
    last_seen_s: NonNegFloat = 0.0
    #: Devices with a booking key, in `devices`' order.
    queues: Annotated[list[DeviceQueue], Field(max_length=64)] = Field(default_factory=list)
    #: The wire level the agent's adverts name (schemas/wire.py: 1 for a release before
    #: levels); 0: not said (a replica before levels answered).
    wire: Annotated[int, Field(ge=0, le=9999)] = 0
    #: Heard from lately, and taking no new work (`mars drain`): not `alive` for planning.
    draining: bool = False


class AgentsReply(WireModel):
    agents: Annotated[list[AgentSummary], Field(max_length=100_000)]
