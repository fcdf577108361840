"""What a NATS connection's asynchronous errors become in MARS's logs (`nats_error_logger`)."""

from __future__ import annotations

import logging

import pytest

from transport.rpc import nats_error_logger


async def test_other_connection_errors_are_warnings_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    log = nats_error_logger(logging.getLogger("mars.test"))
    await log(ConnectionRefusedError(111, "refused"))
    await log(ValueError("a protocol error"))
    got = [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records if r.name == "mars.test"]
    assert got == [
        (logging.DEBUG, "nats: ConnectionRefusedError(111, 'refused')", None),
        (logging.WARNING, "nats: ValueError('a protocol error')", None),
    ]
