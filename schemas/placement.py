"""Orchestrator -> agent commands and the data plane between agents."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from schemas.base import WireModel
from schemas.limits import (
    MAX_DEPS,
    MAX_INLINE_DATA,
    MAX_OUTPUT_BYTES,
    MAX_TASKS,
    Bytes,
    Count,
    Ident,
    Text,
)
from schemas.pipeline import MediaType, PipelineInput, TaskSpec

#: A time on the booking clock (Unix seconds, as orchestrators write bookings).
BookingTime = Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)]

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
    "not_allowlisted",
    #: The offer replaces a placement of the task that already ran on this agent (`replaces`).
    "already_ran",
    #: The offer replaces a placement of the task that is running on this agent now.
    "already_running",
]


class InputRef(WireModel):
    """An input this task waits for: the output of `task_id`, produced on `agent_id`."""

    task_id: Ident
    agent_id: Ident
    nbytes: Bytes = 0
    #: The producer already finished: fetch its output from `agent_id` rather than wait for it.
    ready: bool = False
    #: The fencing token of the producer run this task takes its input from (0: not known
    #: yet, a first placement's provisional offer: any run). An output made under any other
    #: token is refused; a producer placed again has its staying consumers offered again,
    #: naming its new run, before that run is committed.
    token: Count = 0
    #: What the producer's output is (its spec's `output_type`; None: known by its bytes).
    media_type: MediaType | None = None
    #: The wire level `agent_id` reads (0: not known): below `SENDER_SUBJECTS` it pushes on
    #: the older subject that names no sender, and takes acks there.
    wire: Annotated[int, Field(ge=0, le=9999)] = 0


class ConsumerRef(WireModel):
    """Where this task's output must be sent."""

    task_id: Ident
    agent_id: Ident
    #: The wire level `agent_id` reads (schemas/wire.py; 0: not known): its producer's agent
    #: sends it only the fields it knows.
    wire: Annotated[int, Field(ge=0, le=9999)] = 0
    #: The site of `agent_id` (None: not known): a large output for a consumer at its
    #: producer's site crosses in chunks over core NATS, never through the hub's object store.
    site: Ident | None = None


#: Most offers in one batch (one pipeline's tasks on one agent, in practice far fewer).
MAX_BATCH = 1_000


class TaskOffer(WireModel):
    pipeline_id: Ident
    agent_id: Ident
    #: The incarnation the orchestrator planned against; another one means a stale offer.
    incarnation: Ident
    device_id: Ident
    slot: Annotated[int, Field(ge=0, le=1024)] = 0
    #: Fencing token: results are accepted only under the token that placed them. 0: a
    #: provisional offer, sent while the booking is written; the commit brings the token.
    token: Count
    #: Position of this task in the plan's order on its device.
    order: Count = 0
    #: The token of this task's placement on this same agent that this offer replaces (a
    #: re-placement: eviction, lost window, adaptive move), else 0. An agent that has already
    #: run that placement, or is running it, refuses (`already_ran`, `already_running`): the
    #: task keeps that placement instead of being run twice, or killed and run again.
    replaces: Count = 0
    #: The task's booked window on the booking clock (the orchestrators' wall clock, seconds):
    #: an agent runs its ready tasks in the order of their windows, across pipelines, and
    #: starts one ahead of its window only where that delays no earlier window (None: an
    #: orchestrator of an older release; `order` then).
    window_start: BookingTime | None = None
    window_end: BookingTime | None = None
    #: The pipeline's priority: among tasks whose windows start together, the higher first.
    priority: Annotated[int, Field(ge=0, le=1000)] = 100
    task: TaskSpec
    inputs: Annotated[list[InputRef], Field(max_length=MAX_DEPS)] = Field(default_factory=list)
    #: Every task that takes this one's output: as many as a pipeline has other tasks (a
    #: task names at most MAX_DEPS inputs, but any number of tasks may name the same one).
    consumers: Annotated[list[ConsumerRef], Field(max_length=MAX_TASKS)] = Field(
        default_factory=list
    )
    #: The pipeline inputs the task takes (`InputBinding.pipeline_input`): fetched by the agent
    #: from the inputs bucket, by digest, when the task starts.
    pipeline_inputs: Annotated[list[PipelineInput], Field(max_length=64)] = Field(
        default_factory=list
    )


class OfferReply(WireModel):
    pipeline_id: Ident
    task_id: Ident
    agent_id: Ident
    accepted: bool
    code: RejectCode | None = None
    reason: Text = ""


class OfferBatch(WireModel):
    """Several offers to one agent in one request (a pipeline's tasks planned there): one round
    trip per agent instead of one per task. Each offer is admitted as if sent alone."""

    offers: Annotated[list[TaskOffer], Field(min_length=1, max_length=MAX_BATCH)]
    #: The booking clock when sent: with its own monotonic clock an agent tells from it
    #: where "now" falls among booked windows (it never reads its own wall clock for that).
    sent_at: BookingTime | None = None


class OfferBatchReply(WireModel):
    """One reply per offer of the batch, in the batch's order."""

    replies: Annotated[list[OfferReply], Field(max_length=MAX_BATCH)]


class CommitCommand(WireModel):
    """Start the accepted tasks of a pipeline (all offers were accepted first).

    `tokens`, when given, holds each task's fencing token in `task_ids`' order. A first
    placement is offered while its bookings are still being written, so its offers carry
    token 0 ("provisional") and the token arrives here: an agent runs a provisionally offered
    task only once a commit has given it a token, and never under a token older than the one
    it holds.
    """

    pipeline_id: Ident
    task_ids: Annotated[list[Ident], Field(max_length=10_000)]
    tokens: Annotated[list[Count], Field(max_length=10_000)] | None = None
    #: The booking clock when sent (see `OfferBatch.sent_at`).
    sent_at: BookingTime | None = None

    @model_validator(mode="after")
    def _one_token_per_task(self) -> Self:
        if self.tokens is not None and len(self.tokens) != len(self.task_ids):
            raise ValueError(
                f"{len(self.tokens)} tokens for {len(self.task_ids)} tasks: one each, in order"
            )
        return self

    def token_of(self) -> dict[str, int]:
        """Task id -> token (empty without tokens)."""
        return dict(zip(self.task_ids, self.tokens, strict=True)) if self.tokens else {}


class CancelCommand(WireModel):
    pipeline_id: Ident
    reason: Text = ""
    #: Only these tasks (None: every task of the pipeline on this agent).
    task_ids: Annotated[list[Ident], Field(max_length=10_000)] | None = None
    #: Only jobs placed under at most this token: a withdrawal overtaken by the task's next
    #: placement (a higher token) leaves that placement alone. None: whatever the token.
    max_token: Count | None = None


class DrainCommand(WireModel):
    """Stop accepting offers and let accepted work finish (`resume` accepts offers again)."""

    agent_id: Ident
    #: Cancel whatever is still running or queued after this long (None: wait for it all).
    deadline_s: Annotated[float, Field(ge=0.0, le=86_400.0, allow_inf_nan=False)] | None = None
    resume: bool = False


class DrainReply(WireModel):
    agent_id: Ident
    draining: bool
    running: Annotated[int, Field(ge=0, le=1 << 20)]
    #: Accepted jobs not running yet (waiting for commit, inputs or a slot).
    queued: Annotated[int, Field(ge=0, le=1 << 20)]


class JobQuery(WireModel):
    """Does the agent hold `task_id`'s job under `token`? Asked by the stall watchdog about a
    started task whose end it never heard, not even from the events stream."""

    pipeline_id: Ident
    task_id: Ident
    #: Where the asker placed it (named by the `cancelled` event of a job gone).
    device_id: Ident
    token: Annotated[int, Field(ge=1, le=1 << 53)]


#: held: queued or running here under the token (its executor's time limit ends it);
#: ended: it ended here and its end event is sent again; gone: nothing under the token (never
#: held, given up, or its end forgotten): a `cancelled` event under the token says so, and its
#: owner places the task again.
JobHeld = Literal["held", "ended", "gone"]


class JobReply(WireModel):
    pipeline_id: Ident
    task_id: Ident
    state: JobHeld


class EvictNotice(WireModel):
    """Reservations of `pipeline_id` taken by a higher-priority pipeline."""

    pipeline_id: Ident
    task_ids: Annotated[list[Ident], Field(max_length=10_000)]
    device: Annotated[str, Field(max_length=300)]
    by_pipeline: Ident
    reason: Text = ""


class InputGone(WireModel):
    """A consumer's agent asked `producer_agent` for `producer`'s output and was told it holds
    none (`not_found`): handed to another placement of the consumer and let go (a move that
    raced the producer's end), or lost with a restart. Its owner runs again, at once, every
    producer of the consumer that no longer holds its output (the consumer stays where it
    waits), instead of when the stall watchdog finds the consumer starved."""

    pipeline_id: Ident
    consumer: Ident
    #: The consumer's placement (fencing token) that asked: a report of an older one is stale.
    token: Count
    #: Where the consumer runs, and where it asked.
    agent_id: Ident
    producer: Ident
    producer_agent: Ident


#: Key of an output in the data object store: `<pipeline>/<producer>/<token>`.
ObjectKey = Annotated[
    str, StringConstraints(max_length=400, pattern=r"^[A-Za-z0-9_-]+/[A-Za-z0-9_-]+/[0-9]+$")
]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
#: Names one chunked sending of an output (`DataTransfer.stream`).
StreamId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class DataTransfer(WireModel):
    """One output for one consumer: inline bytes, a reference into the object store, or the
    opening of a chunked sending (`stream`).

    Exactly one of `data`, `object_key` and `stream` is set; `sha256` covers the payload
    whichever it is, and the receiver checks it before the consumer sees a byte.
    """

    pipeline_id: Ident
    producer: Ident
    consumer: Ident
    token: Count
    data: Annotated[bytes, Field(max_length=MAX_INLINE_DATA)] | None = None
    sha256: Sha256
    #: Set instead of `data` for payloads above the agent's inline threshold.
    object_key: ObjectKey | None = None
    #: Payload size in bytes (required with `object_key`).
    size: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES)] | None = None
    #: What the producer's executor made of its output (None: known by its bytes). The
    #: consumer decodes it so where the producer's spec declares no `output_type`.
    media_type: MediaType | None = None
    #: Set instead of `data` for a payload that follows in chunks on the same subject, each
    #: a request answered by a `DataAck` (the last one's: the transfer's), to a consumer at
    #: the producer's site: its bytes never leave the site.
    stream: StreamId | None = None

    @model_validator(mode="after")
    def _one_payload(self) -> Self:
        given = sum(x is not None for x in (self.data, self.object_key, self.stream))
        if given != 1:
            raise ValueError("exactly one of data, object_key and stream must be set")
        if (self.object_key is not None or self.stream is not None) and self.size is None:
            raise ValueError("object_key and stream need size")
        if self.data is not None and self.size is not None and self.size != len(self.data):
            raise ValueError(f"size {self.size} != {len(self.data)} inline bytes")
        return self

    @property
    def nbytes(self) -> int:
        return len(self.data) if self.data is not None else (self.size or 0)


class DataAck(WireModel):
    """Receipt of an output; producer and token let a producer's agent release what it kept."""

    pipeline_id: Ident
    consumer: Ident
    ok: bool
    reason: Text = ""
    producer: Ident | None = None
    token: Count | None = None


class FetchRequest(WireModel):
    """A consumer asks a producer's agent for a retained output (after a re-placement).

    `agent_id` is where the consumer now runs: a producer that has not finished yet sends the
    output there when it does.
    """

    pipeline_id: Ident
    producer: Ident
    consumer: Ident
    agent_id: Ident
    #: Only this placement of the producer (None: whatever is retained).
    token: Count | None = None
