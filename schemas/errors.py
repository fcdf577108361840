"""The error envelope every failed request gets back."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from schemas.base import WireModel
from schemas.limits import Text

ErrorCode = Literal[
    "bad_request",
    "payload_too_large",
    "too_deep",
    "invalid",
    "not_found",
    "unschedulable",
    #: No plan fits the pipeline's budget; `details` say the cheapest plan found's cost.
    "over_budget",
    "conflict",
    "unavailable",
    "internal",
]

DetailKey = Annotated[str, StringConstraints(max_length=256)]


class ErrorEnvelope(WireModel):
    code: ErrorCode
    message: Text
    details: Annotated[dict[DetailKey, Text], Field(max_length=500)] = Field(default_factory=dict)


class ServiceError(Exception):
    """Raised by a handler to answer with a specific error code."""

    def __init__(self, code: ErrorCode, message: str, details: dict[str, str] | None = None):
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.details = details or {}
