"""Orchestrator fail-over state in JetStream KV: who owns a pipeline, and what it takes to resume.

`OwnerLease` lives in bucket `MARS_OWNERS` under the pipeline id; `PipelineRecord` (everything a
replica needs to finish a pipeline it did not start) and the pipeline's spec live in
`MARS_RUNS` under `run.<pipeline>` and `spec.<pipeline>`. The public `StatusReply` in
`MARS_PIPELINES` is unchanged by this.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgpack
from pydantic import Field, ValidationError

from schemas.api import PipelineState, PlannedTask, TaskStatus
from schemas.base import WireModel
from schemas.bookings import Instant
from schemas.limits import (
    MAX_CONTAINER_LEN,
    MAX_PAYLOAD_BYTES,
    MAX_STR_LEN,
    MAX_TASKS,
    Count,
    Ident,
    NonNegFloat,
    ShortText,
    Text,
)

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
    planned_cost: NonNegFloat = 0.0
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
    #: Who submitted it (its spec's `user`): `list` on a user's subject reads it here.
    user: Ident | None = None


class RecordHead(WireModel):
    """What `list` reads of a `PipelineRecord` (`read_head`): who it is, its state, when it
    was submitted, how many tasks it has and whose it is."""

    pipeline_id: Ident
    name: Ident
    owner: ShortText
    state: PipelineState
    tasks: Annotated[int, Field(ge=0, le=MAX_TASKS)] = 0
    submitted_wall: Instant = 0.0
    user: Ident | None = None


#: The fields of a record `read_head` reads; it counts `tasks` and skips all the others.
_HEAD = frozenset(RecordHead.model_fields) - {"tasks"}


def read_head(data: bytes) -> RecordHead:
    """The head of a `PipelineRecord` from its msgpack bytes (records are written in msgpack
    only), every other field skipped unbuilt: `list` reads every record, and decoding all of
    a 20-task record took ~4/5 of its cost. DecodeError, with a code, for anything else."""
    # (here, not above: the codec's wire levels register a field of `PipelineRecord`)
    from schemas.codec import DecodeError

    if len(data) > MAX_PAYLOAD_BYTES:
        raise DecodeError("payload_too_large", f"record of {len(data)} bytes")
    reader = msgpack.Unpacker(
        raw=False, strict_map_key=True, max_buffer_size=max(1, len(data)),
        max_str_len=MAX_STR_LEN, max_bin_len=MAX_PAYLOAD_BYTES,
        max_array_len=MAX_CONTAINER_LEN, max_map_len=MAX_CONTAINER_LEN, max_ext_len=0,
    )  # fmt: skip
    reader.feed(data)
    fields: dict[str, Any] = {}
    try:
        for _ in range(reader.read_map_header()):
            key = reader.unpack()
            if type(key) is not str:
                raise DecodeError("bad_request", "map keys must be strings")
            if key == "tasks":
                fields["tasks"] = n = reader.read_array_header()
                for _ in range(n):
                    reader.skip()
            elif key in _HEAD:
                fields[key] = reader.unpack()
            else:
                reader.skip()
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DecodeError("bad_request", f"not a record: {type(exc).__name__}") from exc
    try:
        return RecordHead.model_validate(fields)
    except ValidationError as exc:
        raise DecodeError("invalid", f"record head: {exc.error_count()} errors") from exc


class ReplicaHello(WireModel):
    """An orchestrator replica says it is up (at start and every few seconds) or leaving; one
    that hears a newcomer (`answer`) says hello back, so every replica knows the others (a
    `list` asks each of them)."""

    owner: Ident
    leaving: bool = False
    answer: bool = False
