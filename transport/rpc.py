"""Request/reply glue shared by every service: decode -> handle -> encode, errors as envelopes.

Handlers receive models, never bytes; whatever they raise becomes an error reply with a code,
so a hostile request can neither go unanswered nor take the service down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import nats.errors
from nats.errors import Error as NatsError

from schemas.base import WireModel
from schemas.codec import (
    DecodeError,
    Encoding,
    RemoteError,
    decode,
    decode_reply,
    encode,
    encoding_of,
    error_reply,
    headers_for,
)
from schemas.errors import ServiceError
from schemas.wire import WIRE_LEVEL, code_for, level_of

log = logging.getLogger("mars.rpc")

__all__ = [
    "RemoteError", "ServiceError", "handle", "let_sends_out", "request", "respond", "settle"
]  # fmt: skip

Req = TypeVar("Req", bound=WireModel)
Rep = TypeVar("Rep", bound=WireModel)


async def _answer(
    data: bytes,
    headers: Mapping[str, str] | None,
    model: type[Req],
    fn: Callable[[Req], Awaitable[WireModel]],
) -> WireModel | ServiceError:
    """The handler's reply to request bytes, or why the request is refused, whatever happens."""
    try:
        return await fn(decode(data, model, encoding_of(headers)))
    except DecodeError as exc:
        return ServiceError(exc.code, exc.message, exc.details)
    except ServiceError as exc:
        return exc
    except (TimeoutError, NatsError) as exc:
        # the messaging under it failed (a server restarting, a stream not answering): a
        # retry may well succeed, so the caller is told to try again, not of a bug here
        log.warning("handler for %s: NATS failed: %r", model.__name__, exc)
        why = f"NATS failed ({type(exc).__name__}: {exc}); try again"
        return ServiceError("unavailable", why[:500])
    except Exception as exc:  # the service must stay up
        log.exception("handler for %s failed", model.__name__)
        return ServiceError("internal", f"{type(exc).__name__}: {exc}"[:500])


def _reply(
    out: WireModel | ServiceError, headers: Mapping[str, str] | None
) -> tuple[bytes, dict[str, str]]:
    """The reply in the request's encoding, with only what the requester's level reads."""
    enc = encoding_of(headers)
    if isinstance(out, ServiceError):
        code = code_for(out.code, level_of(headers))
        return error_reply(code, out.message, out.details, enc)
    return encode(out, enc, level_of(headers)), headers_for(enc)


async def handle(
    data: bytes,
    headers: Mapping[str, str] | None,
    model: type[Req],
    fn: Callable[[Req], Awaitable[WireModel]],
) -> tuple[bytes, dict[str, str]]:
    """Turn request bytes into reply bytes (+ headers), whatever happens."""
    return _reply(await _answer(data, headers, model, fn), headers)


async def respond(
    nc: Any,
    msg: Any,
    model: type[Req],
    fn: Callable[[Req], Awaitable[WireModel]],
) -> None:
    """Serve one core-NATS message (not nats.micro) as `handle` does: the answer goes to its
    reply subject; a message sent without one (a new plan's commit) that is refused is said
    in the log instead, since nobody else will hear of it."""
    out = await _answer(msg.data, msg.headers, model, fn)
    if msg.reply:
        body, headers = _reply(out, msg.headers)
        await nc.publish(msg.reply, body, headers=headers)
    elif isinstance(out, ServiceError):
        log.warning(
            "refused a %s on %s: %s: %s", model.__name__, msg.subject, out.code, out.message[:2048]
        )


async def request(
    nc: Any,
    subject: str,
    req: WireModel,
    reply_model: type[Rep],
    *,
    timeout: float = 2.0,
    encoding: Encoding = "msgpack",
    level: int = WIRE_LEVEL,
) -> Rep:
    """Send a request model and decode the reply model (RemoteError on an error envelope).
    `level`: the receiver's wire level, where known (schemas/wire.py)."""
    body, headers = encode(req, encoding, level), headers_for(encoding)
    if len(body) + header_bytes(headers) > nc.max_payload:
        # refused here, not by the server: one over its limit closes the connection (nats-py
        # leaves the headers out of its own check)
        raise nats.errors.MaxPayloadError
    msg = await nc.request(subject, body, timeout=timeout, headers=headers)
    return decode_reply(msg.data, msg.headers, reply_model)


def header_bytes(headers: Mapping[str, str]) -> int:
    """What `headers` add to a message on the wire (the server counts them in its limit)."""
    return len("NATS/1.0\r\n\r\n") + sum(len(k) + len(v) + 4 for k, v in headers.items())


async def settle(nc: Any, timeout: float = 2.0) -> None:
    """Return once the server has processed every command `nc` queued before the call.

    A single `flush()` does not promise that with nats-py (2.16): it writes its PING to the
    socket ahead of commands still queued for the flusher task, so the PONG can arrive before an
    earlier SUB has reached the server, and a request from another connection then meets "no
    responders". The first flush hands the queue to the socket; the second PING travels behind
    it, so its PONG means the server has seen everything.
    """
    wait = max(1, round(timeout))
    await nc.flush(timeout=wait)
    await nc.flush(timeout=wait)


async def let_sends_out() -> None:
    """Give the event loop two turns, so a request started just before (a task) reaches the
    socket before the caller takes the CPU for a while: one turn for the task to queue its
    bytes, one for nats-py's flusher task to write them. Scheduling, not synchronisation:
    nothing depends on it but how soon the request leaves."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


#: What a connection meets while its server is away or restarting: expected, not news.
CONNECTION_LOST = (
    OSError, TimeoutError, nats.errors.UnexpectedEOF, nats.errors.StaleConnectionError
)  # fmt: skip


def nats_error_logger(logger: logging.Logger) -> Callable[[Exception], Awaitable[None]]:
    """An `error_cb` for `nats.connect`: nats-py's own prints "nats: encountered error" with
    a traceback for every failed reconnect attempt (to stderr, in a process that configured
    no logging), so a routine server restart filled logs with tracebacks. Lost-connection
    errors go to debug; anything else is a warning, without the traceback."""

    async def log(exc: Exception) -> None:
        level = logging.DEBUG if isinstance(exc, CONNECTION_LOST) else logging.WARNING
        logger.log(level, "nats: %r", exc)

    return log
