"""Failure detection and recovery on the wire: cluster events and committed task results."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import WireModel
from schemas.limits import Bytes, Count, Ident, NonNegFloat, ShortText, Text

ClusterEventKind = Literal[
    "agent_suspect",
    "agent_alive",
    "agent_dead",
    "partition_suspected",
    "partition_ended",
]


class ClusterEvent(WireModel):
    """What an orchestrator concluded about agents (published on `mars.v1.events.cluster`)."""

    kind: ClusterEventKind
    agents: Annotated[list[Ident], Field(max_length=10_000)] = Field(default_factory=list)
    #: heartbeat | disconnect | partition_timeout | heartbeats_returned | ...
    cause: ShortText = ""
    reason: Text = ""
    #: The publishing orchestrator, so replicas' views can be told apart.
    orchestrator: ShortText = ""


class TaskResult(WireModel):
    """A task's committed result: KV `MARS_RESULTS`, key `<pipeline>.<task>`, created once."""

    pipeline_id: Ident
    task_id: Ident
    agent_id: Ident
    incarnation: Ident
    device_id: Ident
    #: The fencing token of the placement that produced it.
    token: Count
    event_id: Ident
    duration_s: NonNegFloat | None = None
    output_bytes: Bytes = 0
    result: ShortText = ""
    committed_by: ShortText = ""
