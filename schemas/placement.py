"""Orchestrator -> agent commands and the data plane between agents."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from schemas.base import WireModel
from schemas.limits import MAX_DEPS, MAX_INLINE_DATA, Bytes, Count, Ident, Text
from schemas.pipeline import TaskSpec

RejectCode = Literal[
    "no_capacity",
    "no_memory",
    "kind_not_allowed",
    "unknown_device",
    "unhealthy",
    "draining",
    "stale_token",
    "stale_incarnation",
    "missing_model",
    "duplicate",
    "bad_spec",
]


class InputRef(WireModel):
    """An input this task waits for: the output of `task_id`, produced on `agent_id`."""

    task_id: Ident
    agent_id: Ident
    nbytes: Bytes = 0


class ConsumerRef(WireModel):
    """Where this task's output must be sent."""

    task_id: Ident
    agent_id: Ident


class TaskOffer(WireModel):
    pipeline_id: Ident
    agent_id: Ident
    #: The incarnation the orchestrator planned against; another one means a stale offer.
    incarnation: Ident
    device_id: Ident
    slot: Annotated[int, Field(ge=0, le=1024)] = 0
    #: Fencing token: results are accepted only under the token that placed them.
    token: Count
    #: Position of this task in the plan's order on its device.
    order: Count = 0
    task: TaskSpec
    inputs: Annotated[list[InputRef], Field(max_length=MAX_DEPS)] = Field(default_factory=list)
    consumers: Annotated[list[ConsumerRef], Field(max_length=MAX_DEPS)] = Field(
        default_factory=list
    )


class OfferReply(WireModel):
    pipeline_id: Ident
    task_id: Ident
    agent_id: Ident
    accepted: bool
    code: RejectCode | None = None
    reason: Text = ""


class CommitCommand(WireModel):
    """Start the accepted tasks of a pipeline (all offers were accepted first)."""

    pipeline_id: Ident
    task_ids: Annotated[list[Ident], Field(max_length=10_000)]


class CancelCommand(WireModel):
    pipeline_id: Ident
    reason: Text = ""
    #: Only these tasks (None: every task of the pipeline on this agent).
    task_ids: Annotated[list[Ident], Field(max_length=10_000)] | None = None


class EvictNotice(WireModel):
    """Reservations of `pipeline_id` taken by a higher-priority pipeline."""

    pipeline_id: Ident
    task_ids: Annotated[list[Ident], Field(max_length=10_000)]
    device: Annotated[str, Field(max_length=300)]
    by_pipeline: Ident
    reason: Text = ""


class DataTransfer(WireModel):
    pipeline_id: Ident
    producer: Ident
    consumer: Ident
    token: Count
    data: Annotated[bytes, Field(max_length=MAX_INLINE_DATA)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]


class DataAck(WireModel):
    pipeline_id: Ident
    consumer: Ident
    ok: bool
    reason: Text = ""
