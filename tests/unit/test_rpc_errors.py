"""A handler's failure is answered with a code that says what the caller can do about it."""

from __future__ import annotations

import pytest
from nats.errors import NoRespondersError

from schemas.api import StatusReply, StatusRequest
from schemas.codec import decode, encode
from schemas.errors import ErrorEnvelope
from transport.rpc import handle


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (TimeoutError("nats: timeout"), "unavailable"),  # the messaging under it: try again
        (NoRespondersError(), "unavailable"),
        (ValueError("a bug"), "internal"),
    ],
)
async def test_a_failing_handler_is_answered_with_the_code_for_its_failure(
    raised: Exception, code: str
) -> None:
    async def fail(_req: StatusRequest) -> StatusReply:
        raise raised

    body, headers = await handle(encode(StatusRequest(pipeline_id="p")), None, StatusRequest, fail)
    env = decode(body, ErrorEnvelope)
    assert env.code == code and headers["Nats-Service-Error-Code"] == code
