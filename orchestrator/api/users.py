"""The API as one user asks it: `mars.v1.api.<op>.<user>` (schemas/subjects.py `api_as`).

The server's permissions are by subject, and nothing else of a request (headers, payload)
says who sent it: in the secure deployment a user may publish only on the API subjects that
end in its own name, so the subject is the user's identity. On those subjects a pipeline
submitted is that user's (`PipelineSpec.user`, kept in its spec and record, and with them
through fail-over); `status` and `cancel` of another's pipeline are answered as for one that
does not exist (`not_found`, nothing of it said); `list` lists that user's alone; `agents` is
the fleet as anyone sees it. The unsuffixed subjects are the admin's: every pipeline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from nats.js.errors import KeyDeletedError, KeyNotFoundError
from pydantic import TypeAdapter, ValidationError

from schemas import subjects
from schemas.api import (
    AgentsReply,
    AgentsRequest,
    CancelReply,
    CancelRequest,
    ListReply,
    ListRequest,
    StatusReply,
    StatusRequest,
    SubmitRequest,
)
from schemas.base import WireModel
from schemas.codec import DecodeError, decode
from schemas.errors import ServiceError
from schemas.failover import RUNS_BUCKET, spec_key
from schemas.limits import Ident
from schemas.pipeline import PipelineSpec

if TYPE_CHECKING:
    from orchestrator.api.queries import Queries
    from orchestrator.ports import QueriesDoor

USER = TypeAdapter(Ident)
Req = TypeVar("Req", bound=WireModel)
Rep = TypeVar("Rep", bound=WireModel)


def user_of(subject: str) -> str | None:
    """The user a request's subject names (None: an unsuffixed subject, the admin's);
    ServiceError `invalid` for a token that is not an identity name (`Ident`)."""
    token = subjects.api_user(subject)
    if token is None:
        return None
    try:
        return USER.validate_python(token)
    except ValidationError:
        raise ServiceError("invalid", f"user {token[:160]!r}: 1-128 of A-Z a-z 0-9 _ -") from None


def as_user(req: SubmitRequest, user: str | None) -> SubmitRequest:
    """A submission as the subject it came on says: on a user's subject the pipeline is
    that user's (a spec naming another user is refused `invalid`); on the admin's, as it
    says (unnamed, or submitted for the user its spec names)."""
    if user is None:
        return req
    named = req.pipeline.user
    if named is not None and named != user:
        raise ServiceError("invalid", f"the pipeline names user {named}, submitted as {user}")
    if named == user:
        return req
    return req.model_copy(update={"pipeline": req.pipeline.model_copy(update={"user": user})})


def unknown(pid: str) -> ServiceError:
    """What `status` and `cancel` answer for a pipeline nobody knows, word for word."""
    return ServiceError("not_found", f"no pipeline {pid}")


def for_user(
    fn: Callable[[Req, str], Awaitable[Rep]], subject: str
) -> Callable[[Req], Awaitable[Rep]]:
    """`fn` as served on `subject`, one user's: given the user it names (checked here)."""

    async def served(req: Req) -> Rep:
        user = user_of(subject)
        if user is None:  # (only the per-user subjects are served this way)
            raise ServiceError("invalid", f"{subject} names no user")
        return await fn(req, user)

    return served


class UserQueries:
    """`status`, `list`, `cancel` and `agents` as one user asks them (`Queries` answers the
    admin's, and these once the pipeline is found to be the user's)."""

    def __init__(self, o: QueriesDoor, queries: Queries) -> None:
        self.o = o
        self.q = queries
        self._runs: Any = None

    async def whose(self, pid: str) -> str | None:
        """The user a pipeline was submitted by: as the copy held here says, or its spec in
        `MARS_RUNS` (written before its submit was answered, kept while it is; `status`
        from a record needs it too). None: unnamed, or no such pipeline."""
        run = self.o.pipelines.get(pid)
        if run is not None:
            return run.spec.user
        try:
            if self._runs is None:
                self._runs = await self.o.js.key_value(RUNS_BUCKET)
            entry = await self._runs.get(spec_key(pid))
        except (KeyNotFoundError, KeyDeletedError):
            return None
        except Exception as exc:  # JetStream not answering: for any pipeline, known or not
            raise ServiceError(
                "unavailable", f"whose pipeline {pid} is cannot be read now; ask again"
            ) from exc
        try:
            return decode(entry.value, PipelineSpec).user
        except DecodeError:
            return None  # a spec this release cannot read: nobody's

    async def _mine(self, pid: str, user: str) -> None:
        """Raise as for an unknown pipeline unless it is `user`'s."""
        if await self.whose(pid) != user:
            raise unknown(pid)

    async def status(self, req: StatusRequest, user: str) -> StatusReply:
        await self._mine(req.pipeline_id, user)
        return await self.q.status(req)

    async def cancel(self, req: CancelRequest, user: str) -> CancelReply:
        await self._mine(req.pipeline_id, user)
        return await self.q.cancel(req)

    async def list(self, req: ListRequest, user: str) -> ListReply:
        return await self.q.list(req.model_copy(update={"user": user}))

    async def agents(self, req: AgentsRequest, user: str) -> AgentsReply:
        return await self.q.agents(req)
