"""Wire levels: what a peer of an older release can read, so one release's peers work with the
next one's while a fleet is upgraded.

Every wire model is closed (`extra="forbid"`), so a receiver refuses a field it does not
know. Every message MARS sends with headers names the sender's level (`Mars-Wire`); a message
without it is from a release before levels (level 1). A sender that knows its receiver's
level leaves out the fields added after it: the orchestrator for an agent (the level of the
agent's adverts) and for a client (the level of its request). A field is added only with a
default, so a message without it still reads as before on a newer receiver. Agents and
clients hear nothing of a replica's level, so replicas are upgraded first (docs/operations.md,
"Upgrading").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from schemas.advisories import AdvisoryClient, ConnectionAdvisory
from schemas.agent import AgentAdvert
from schemas.api import (
    AgentSummary,
    ListReply,
    ListRequest,
    PipelineSummary,
    StatusReply,
    SubmitReply,
    TaskStatus,
)
from schemas.base import WireModel
from schemas.errors import ErrorCode
from schemas.events import TaskEvent, TaskOutcome
from schemas.failover import PipelineRecord
from schemas.pipeline import ExecRun, OnnxRun, PipelineSpec, PythonRun, TaskSpec
from schemas.placement import (
    CommitCommand,
    ConsumerRef,
    DataTransfer,
    InputRef,
    OfferBatch,
    TaskOffer,
)
from schemas.predictor import CorrectionTrack
from schemas.recovery import TaskResult

WIRE_HEADER = "Mars-Wire"
#: This release's level.
WIRE_LEVEL = 7
#: The first level whose agents name themselves in the subjects of what they send one
#: another and the orchestrators (task events, `input_gone`, data pushes and acks:
#: schemas/subjects.py); to an older agent the older forms are used, and from one accepted.
SENDER_SUBJECTS = 5

#: Fields added after level 1, by model: the level that added each. A field named here
#: must have a default, so a message from an older sender still reads.
ADDED: dict[type[WireModel], dict[str, int]] = {
    # level 2 (2026-12-02): output fencing, ONNX time limits, `list` over every replica,
    # each agent's level in `mars agents`
    OnnxRun: {"timeout_s": 2, "random_inputs": 3},
    PipelineSummary: {"submitted": 2, "owner": 2},
    ListReply: {"unanswered": 2, "total": 3},
    ListRequest: {"offset": 3, "user": 5},
    AgentSummary: {"wire": 2, "draining": 3},
    # level 3 (2026-12-06): the producer runs a task's inputs came from, on its end event;
    # booked windows on offers, and the booking clock on offers and commits
    TaskEvent: {
        "input_tokens": 3,
        "output_sha256": 3,
        "output_type": 3,
        "output_key": 3,
        "load_s": 7,  # level 7 (below)
        "cold": 7,
        "shared": 7,
    },
    TaskOutcome: {"output_sha256": 3, "output_type": 3, "output_key": 3},
    TaskResult: {"output_sha256": 3, "output_type": 3, "output_key": 3},
    TaskStatus: {"output_sha256": 3, "output_type": 3, "output_key": 3},
    ExecRun: {"output": 3},
    PythonRun: {"bundle": 3},
    TaskOffer: {"window_start": 3, "window_end": 3, "priority": 3, "pipeline_inputs": 3},
    OfferBatch: {"sent_at": 3},
    CommitCommand: {"sent_at": 3},
    # level 4 (2026-12-06): the artifacts an agent holds, on its adverts (placement charges
    # the fetch to agents without them); the media type an output was made as, with it
    # between agents, and each consumer's agent's level on offers (a producer's agent sends
    # a level-3 one no media type)
    AgentAdvert: {"artifacts": 4, "nkey": 5, "warm_models": 7},
    DataTransfer: {"media_type": 4, "stream": 5},
    ConsumerRef: {"wire": 4, "site": 5},
    # level 5 (2026-12-08): senders named in subjects (SENDER_SUBJECTS); each producer's
    # agent's level on offers; each consumer's agent's site on offers, and outputs sent in
    # chunks over core NATS to a consumer at the producer's site (`DataTransfer.stream`);
    # outputs kept for `mars get` only where asked (`TaskSpec.keep_output`) or of sinks
    InputRef: {"token": 2, "media_type": 3, "wire": 5},
    TaskSpec: {"inputs": 3, "output_type": 3, "keep_output": 5},
    # level 5 too: whose a pipeline is, as the per-user API subject it was submitted on says
    # (`PipelineSpec.user`, kept in its record too), and `list` of one user's
    PipelineRecord: {"user": 5, "planned_cost": 6},
    # the server's connection advisories (its format, read only, never sent by MARS): who
    # the server authenticated, and why it closed a connection
    AdvisoryClient: {"user": 5},
    ConnectionAdvisory: {"reason": 5},
    # (and in `mars agents`, a draining agent told from a silent one: AgentSummary.draining;
    # `mars list` in pages of every kept record: ListRequest.offset, ListReply.total)
    # level 6: money a user can reach: a pipeline's budget and time-for-money weight, and
    # what its plan is predicted to cost on the submit and status replies and its record
    PipelineSpec: {"inputs": 3, "user": 5, "budget": 6, "money_weight": 6},
    SubmitReply: {"cost": 6},
    StatusReply: {"planned_cost": 6},
    # level 7: an ONNX run's end event says the model's load and session creation apart
    # from its run time (`TaskEvent.load_s`), and whether its session was made for it
    # (`TaskEvent.cold`; TaskEvent above); the predictor's stored tracks keep warm runs'
    # history and cold runs apart (a replica of an older release skips such a record); an
    # agent's advert names the models it holds a session for (`AgentAdvert.warm_models`,
    # above): placement charges the load to agents without it
    # level 7 too: an end event says how many other jobs its agent ran at the same time
    # (`TaskEvent.shared`), and the stored tracks keep such contended runs apart
    CorrectionTrack: {
        "warm": 7,
        "warm_s": 7,
        "cold_n": 7,
        "cold_s": 7,
        "load_s": 7,
        "contended": 7,
        "contended_n": 7,
    },
}
#: Error codes added after level 1: the level that added each, and the code a requester of
#: an older level is answered with instead (one it knows).
ADDED_CODES: dict[str, tuple[int, ErrorCode]] = {"over_budget": (6, "unschedulable")}


def level_of(headers: Mapping[str, str] | None) -> int:
    """The level a message's sender reads: 1 without the header (or with a bad one), and
    never above this release's (a newer peer reads all of this release's fields)."""
    raw = headers.get(WIRE_HEADER) if headers else None
    if raw is None or len(raw) > 4 or not (raw.isascii() and raw.isdigit()):
        return 1  # ("²".isdigit() holds, and int("²") raises: any header may be hostile)
    return max(1, min(int(raw), WIRE_LEVEL))


def code_for(code: ErrorCode, level: int) -> ErrorCode:
    """The error code a requester of `level` is answered with (see `ADDED_CODES`)."""
    added = ADDED_CODES.get(code)
    return added[1] if added is not None and added[0] > level else code


def _holds_added(model: type[WireModel], seen: set[type[WireModel]]) -> bool:
    """Whether a model, or one nested in it at any depth, has a field in ADDED."""
    if model in ADDED:
        return True
    seen.add(model)
    for field in model.model_fields.values():
        for sub in _models_in(field.annotation):
            if sub not in seen and _holds_added(sub, seen):
                return True
    return False


def _models_in(annotation: Any) -> list[type[WireModel]]:
    if isinstance(annotation, type) and issubclass(annotation, WireModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]


@functools.cache
def holds_added(model: type[WireModel]) -> bool:
    """Whether a message of this model can carry a field an older level does not know."""
    return _holds_added(model, set())


def dump_for(model: WireModel, level: int, mode: str) -> dict[str, Any]:
    """`model_dump(mode=mode)` without the fields added after `level`, at any depth."""
    out: dict[str, Any] = model.model_dump(mode=mode)
    _strip(model, out, level)
    return out


def _strip(obj: Any, dumped: Any, level: int) -> None:
    if isinstance(obj, WireModel):
        model = type(obj)
        if not holds_added(model):
            return
        added = ADDED.get(model, {})
        for name in model.model_fields:
            if added.get(name, 1) > level:
                dumped.pop(name, None)
            else:
                _strip(getattr(obj, name), dumped.get(name), level)
    elif isinstance(obj, list | tuple):
        for item, d in zip(obj, dumped, strict=True):
            _strip(item, d, level)
    elif isinstance(obj, dict):  # (keys may be dumped as other types; the order is kept)
        for item, d in zip(obj.values(), dumped.values(), strict=True):
            _strip(item, d, level)
