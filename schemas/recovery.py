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


#: Tasks whose results share one key of `MARS_RESULTS` (by their place in the spec).
RESULTS_PER_KEY = 32


class TaskResult(TaskOutcome):
    """A task's committed result, made once from the `succeeded` event (`event_id` names
    it): an entry of `TaskResults`."""

    committed_by: ShortText = ""

    @classmethod
    def of(cls, ev: TaskOutcome, committed_by: str) -> TaskResult:
        return cls(
            **ev.model_dump(include=set(TaskOutcome.model_fields)), committed_by=committed_by
        )


class TaskResults(WireModel):
    """Committed results of up to RESULTS_PER_KEY tasks of a pipeline: KV `MARS_RESULTS`, key
    `<pipeline>.<n>` for the tasks at places n * RESULTS_PER_KEY onwards in its spec. Each
    write (CAS on the key's revision) adds entries; none is ever changed or removed."""

    pipeline_id: Ident
    results: Annotated[list[TaskResult], Field(max_length=RESULTS_PER_KEY)] = Field(
        default_factory=list
    )
