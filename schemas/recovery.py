"""Failure detection and recovery on the wire: cluster events and committed task results."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import WireModel
from schemas.events import TaskOutcome
from schemas.limits import Ident, ShortText, Text

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


class TaskResult(TaskOutcome):
    """A task's committed result: KV `MARS_RESULTS`, key `<pipeline>.<task>`, created once
    from the `succeeded` event (`event_id` names it)."""

    committed_by: ShortText = ""

    @classmethod
    def of(cls, ev: TaskOutcome, committed_by: str) -> TaskResult:
        return cls(
            **ev.model_dump(include=set(TaskOutcome.model_fields)), committed_by=committed_by
        )
