"""Offline autonomy: task events go through an on-disk journal to JetStream, and reconnects back
off with jitter.

An event is journaled before it is sent and marked done only when the `MARS_EVENTS` stream
acknowledged it, so events produced while NATS is unreachable (or before a crash) are replayed in
order once it is back, and never again after that. Each carries its `event_id` as
`Nats-Msg-Id`: the stream drops a resend whose acknowledgement was lost, and the orchestrator
applies an event id once anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from edge_agent.journal import Journal, JournalFull
from schemas import subjects
from transport import connect
from transport.rpc import nats_error_logger, settle

log = logging.getLogger("mars.agent.outbox")
MSG_ID = "Nats-Msg-Id"
#: Seconds between re-checks for the events stream while it is missing.
STREAM_RECHECK_S = 10.0


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random) -> float:
    """Equal-jitter exponential backoff: half of the doubled delay fixed, half random."""
    d = min(cap, base * 2.0 ** min(attempt, 30))
    return d / 2 + rng.uniform(0.0, d / 2)


ReconnectHandler = Callable[[list[Any], dict[str, Any]], tuple[Any, float]]


def reconnect_handler(
    base: float, cap: float, rng: random.Random | None = None
) -> ReconnectHandler:
    """nats-py `reconnect_to_server_handler`: the least-tried server after a jittered delay."""
    rand = rng or random.Random()

    def pick(servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        return server, backoff_delay(server.reconnects, base, cap, rand)

    return pick


async def connect_agent(
    url: str,
    name: str,
    disconnected: Callable[[], Awaitable[None]],
    reconnected: Callable[[], Awaitable[None]],
    reconnect_base_s: float,
    reconnect_max_s: float,
) -> NATS:
    """An agent's connection (or an emulated fleet's shared one): reconnecting for ever with
    jittered back-off, telling `disconnected` / `reconnected` as it goes."""
    return await nats.connect(
        connect.servers(url),
        name=name,
        max_reconnect_attempts=-1,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        error_cb=nats_error_logger(logging.getLogger("mars.agent")),
        **reconnect_options(reconnect_base_s, reconnect_max_s),
        **connect.options(),
    )


def reconnect_options(base: float, cap: float) -> dict[str, Any]:
    """Connect options for jittered reconnects. nats-py has no jitter option of its own; recent
    versions (2.16 here) take a server-selection hook that returns a delay: it carries the
    backoff."""
    if "reconnect_to_server_handler" in inspect.signature(NATS.connect).parameters:
        return {"reconnect_to_server_handler": reconnect_handler(base, cap)}
    # older nats-py: a fixed wait, drawn once per process so agents still spread out
    return {"reconnect_time_wait": backoff_delay(2, base, cap, random.Random())}


class Outbox:
    def __init__(self, journal: Journal, *, batch: int = 64, ack_timeout: float = 2.0) -> None:
        self.journal = journal
        self.batch = batch
        self.ack_timeout = ack_timeout
        self.nc: NATS | None = None
        self.js: Any = None
        self.sent = 0
        self.dropped = 0
        #: Notified whenever entries are delivered (tests and shutdown wait on it).
        self.changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._stream: bool | None = None
        self._stream_checked = 0.0
        self._loose: set[asyncio.Task[None]] = set()

    def attach(self, nc: NATS) -> None:
        self.nc = nc
        self.js = connect.jetstream(nc)
        self._wake.set()

    def wake(self) -> None:
        """Connectivity came back (or something was queued): try sending now."""
        self._stream = None
        self._wake.set()

    def emit(self, subject: str, key: str, data: bytes) -> None:
        """Queue one message under an idempotency key; never blocks on the network."""
        try:
            self.journal.append(key, subject, data)
        except (JournalFull, OSError) as exc:
            # out of buffer: still try to send it, from memory only
            self.dropped += 1
            log.warning("event %s not journaled (%s); sending best-effort", key, exc)
            if self.nc is not None and self.nc.is_connected:
                task = asyncio.get_running_loop().create_task(self._best_effort(subject, key, data))
                self._loose.add(task)
                task.add_done_callback(self._loose.discard)
        self._wake.set()

    async def run(self) -> None:
        """Pump the journal whenever woken; retry failed sends with a growing delay."""
        delay = 0.5
        while True:
            await self._wake.wait()
            self._wake.clear()
            if await self._pump():
                delay = 0.5
                continue
            if self.nc is None or not self.nc.is_connected:
                continue  # offline: the reconnect wakes us
            # connected but sends failed: retry on a timer (asyncio.timeout, unlike wait_for
            # in 3.11, never swallows a cancellation that races the wake-up)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            self._wake.set()
            delay = min(delay * 2, 10.0)

    async def wait_empty(self, timeout: float) -> bool:
        """Wait until everything journaled was delivered (bounded; for a graceful stop)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), self.changed:
                await self.changed.wait_for(lambda: len(self.journal) == 0)
        return len(self.journal) == 0

    async def _pump(self) -> bool:
        """Send pending entries in order; False if some could not be sent (retry later)."""
        while self.nc is not None and self.nc.is_connected:
            batch = self.journal.pending()[: self.batch]
            if not batch:
                return True
            results = await asyncio.gather(
                *(self._send(e.topic, e.key, e.data) for e in batch), return_exceptions=True
            )
            done = [e.seq for e, ok in zip(batch, results, strict=True) if ok is True]
            for r in results:
                if isinstance(r, BaseException):
                    log.debug("event send failed: %s: %s", type(r).__name__, r)
            self.journal.mark_done(done)
            self.sent += len(done)
            async with self.changed:
                self.changed.notify_all()
            if len(done) < len(batch):
                return False
        return not self.journal.pending()

    async def _has_stream(self) -> bool:
        now = time.monotonic()
        if self._stream is None or (
            not self._stream and now > self._stream_checked + STREAM_RECHECK_S
        ):
            try:
                await self.js.stream_info(subjects.EVENTS_STREAM)
                self._stream = True
            except NotFoundError:
                self._stream = False
            self._stream_checked = now
        return self._stream

    async def _send(self, subject: str, key: str, data: bytes) -> bool:
        if await self._has_stream():
            await self.js.publish(subject, data, timeout=self.ack_timeout, headers={MSG_ID: key})
            return True
        # no stream captures events (no orchestrator has run yet): plain publish, as before
        await self._publish_plain(subject, key, data)
        return True

    async def _publish_plain(self, subject: str, key: str, data: bytes) -> None:
        assert self.nc is not None
        await self.nc.publish(subject, data, headers={MSG_ID: key})
        await settle(self.nc, self.ack_timeout)

    async def _best_effort(self, subject: str, key: str, data: bytes) -> None:
        try:
            await self._publish_plain(subject, key, data)
        except Exception as exc:
            log.warning("event %s lost: %s", key, exc)
