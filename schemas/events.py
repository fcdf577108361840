"""Events: what happened to tasks and pipelines (kept in a stream for replay)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from schemas.base import WireModel
from schemas.limits import MAX_DEPS, Bytes, Count, Ident, NonNegFloat, ShortText, Text
from schemas.pipeline import MediaType
from schemas.placement import Sha256

#: A task output's key in the outputs bucket: `<pipeline>/<task>/<token>`.
OutputKey = Annotated[
    str, StringConstraints(max_length=400, pattern=r"^[A-Za-z0-9_-]+/[A-Za-z0-9_-]+/[0-9]+$")
]

TaskEventState = Literal["accepted", "started", "succeeded", "failed", "cancelled"]


class TaskOutcome(WireModel):
    """What a task run produced, and under which placement: shared by the event an agent
    sends and the result an orchestrator commits from it."""

    #: Idempotency key: the same event delivered twice is applied once.
    event_id: Ident
    pipeline_id: Ident
    task_id: Ident
    agent_id: Ident
    incarnation: Ident
    device_id: Ident
    #: The fencing token of the placement the run belongs to.
    token: Count
    duration_s: NonNegFloat | None = None
    output_bytes: Bytes = 0
    result: ShortText = ""
    #: On a success: the output's digest and media type, and its key in the outputs bucket
    #: (`subjects.OUTPUTS_BUCKET`) when its agent kept it there (not for synthetic tasks).
    output_sha256: Sha256 | None = None
    output_type: MediaType | None = None
    output_key: OutputKey | None = None


class TaskEvent(TaskOutcome):
    state: TaskEventState
    error: Text = ""
    #: On an end: the fencing token of the producer run each input came from (producer task
    #: -> token). The owner commits the result only if every one is its producer's committed
    #: run, and runs the task again otherwise. None: not said (an agent of an older release).
    input_tokens: Annotated[dict[Ident, Count], Field(max_length=MAX_DEPS)] | None = None
    #: On an end of an ONNX run: seconds spent loading the model and creating its ONNX
    #: Runtime session for this run (0 when a session was ready), kept out of `duration_s`,
    #: which is then the time of the model's runs alone. None: not said (another kind of
    #: task, or an agent of an older release, whose `duration_s` includes any load).
    load_s: NonNegFloat | None = None
    #: Whether the run's session was created for it (its first run on the agent, whose
    #: runs are slower than later ones); None: not said.
    cold: bool | None = None
    #: On an end: the most other jobs its agent ran at the same time while it ran (0: it ran
    #: alone). None: not said (an agent of an older release; taken as 0).
    shared: Annotated[int, Field(ge=0, le=1 << 20)] | None = None


class PipelineEvent(WireModel):
    pipeline_id: Ident
    state: Literal[
        "pending", "placing", "running", "succeeded", "failed", "cancelled", "unschedulable"
    ]
    reason: Text = ""
    #: Orchestrator-clock seconds since submission.
    at_s: NonNegFloat = 0.0
