"""A small async client for the API, used by the CLI, the demo and tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from pydantic import TypeAdapter

from schemas import subjects
from schemas.api import (
    TERMINAL_STATES,
    AgentsReply,
    AgentsRequest,
    CancelReply,
    CancelRequest,
    ListReply,
    ListRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from schemas.codec import Encoding, RemoteError
from schemas.limits import Ident
from schemas.pipeline import PipelineSpec
from transport import connect
from transport.rpc import nats_error_logger, request

log = logging.getLogger("mars.client")
#: A user's name is a token of its API subjects: an identity name.
_USER = TypeAdapter(Ident)


class Client:
    """Requests go as JSON (replies come back in it): pydantic parses and validates JSON in
    one pass, ~40% less work on both sides than msgpack for a 20-task submit (see
    docs/protocol.md). msgpack stays the default for anyone who does not say."""

    def __init__(
        self, nc: NATS, timeout: float = 10.0, encoding: Encoding = "json", user: str | None = None
    ) -> None:
        self.nc = nc
        self.timeout = timeout
        self.encoding: Encoding = encoding
        #: Asks as this user (`mars.v1.api.<op>.<user>`: its own pipelines alone, as the
        #: server's permissions let it); None: on the unsuffixed subjects, the admin's.
        self.user = _USER.validate_python(user) if user is not None else None

    def _on(self, subject: str) -> str:
        """One of the API's subjects as this client asks it."""
        return subject if self.user is None else subjects.api_as(subject, self.user)

    @classmethod
    async def connect(
        cls, url: str, timeout: float = 10.0, reconnects: int = 3, user: str | None = None
    ) -> Client:
        """`reconnects`: attempts to get a lost connection back (2 s apart) before giving up
        for good; -1, for ever (a long-lived client that must outlast a server restart).
        `user`: see `Client.user` (checked before connecting: ValueError)."""
        if user is not None:
            _USER.validate_python(user)
        nc = await nats.connect(
            connect.servers(url), name="mars-client", connect_timeout=5,
            max_reconnect_attempts=reconnects, error_cb=nats_error_logger(log),
            **connect.options(),
        )  # fmt: skip
        return cls(nc, timeout, user=user)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()

    async def submit(self, spec: PipelineSpec, pipeline_id: str | None = None) -> SubmitReply:
        req = SubmitRequest(
            pipeline=spec, pipeline_id=pipeline_id, timeout_ms=max(1, round(1e3 * self.timeout))
        )
        return await request(
            self.nc,
            self._on(subjects.SUBMIT),
            req,
            SubmitReply,
            timeout=self.timeout,
            encoding=self.encoding,
        )

    async def status(self, pipeline_id: str) -> StatusReply:
        return await request(
            self.nc,
            self._on(subjects.STATUS),
            StatusRequest(pipeline_id=pipeline_id),
            StatusReply,
            timeout=self.timeout,
            encoding=self.encoding,
        )

    async def list(self, **kw: Any) -> ListReply:
        return await request(
            self.nc,
            self._on(subjects.LIST),
            ListRequest(**kw),
            ListReply,
            timeout=self.timeout,
            encoding=self.encoding,
        )

    async def cancel(self, pipeline_id: str, reason: str = "") -> CancelReply:
        return await request(
            self.nc,
            self._on(subjects.CANCEL),
            CancelRequest(pipeline_id=pipeline_id, reason=reason),
            CancelReply,
            timeout=self.timeout,
            encoding=self.encoding,
        )

    async def agents(self, alive_only: bool = False) -> AgentsReply:
        return await request(
            self.nc,
            self._on(subjects.AGENTS),
            AgentsRequest(alive_only=alive_only),
            AgentsReply,
            timeout=self.timeout,
            encoding=self.encoding,
        )

    async def wait_for_agents(self, n: int, timeout: float) -> int:
        """Poll the cluster view until `n` agents are alive (bounded by `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        alive = 0
        while loop.time() < deadline:
            with contextlib.suppress(Exception):
                alive = len((await self.agents(alive_only=True)).agents)
                if alive >= n:
                    return alive
            await asyncio.sleep(0.1)  # polling the API with a deadline
        return alive

    async def wait(self, pipeline_id: str, timeout: float) -> StatusReply:
        """Wait for a terminal state: woken by pipeline events, with a status poll as backstop."""
        changed = asyncio.Event()

        async def on_event(_msg: Msg) -> None:
            changed.set()

        # a user hears its own pipelines' events only (the deploy's permissions)
        heard = (
            subjects.pipeline_event(pipeline_id)
            if self.user is None
            else subjects.user_pipeline_event(self.user, pipeline_id)
        )
        sub = await self.nc.subscribe(heard, cb=on_event)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    changed.clear()
                    try:
                        st = await self.status(pipeline_id)
                    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                        # no replica reachable this moment (a hub node lost, replicas
                        # reconnecting, the queue group moving): the pipeline runs on
                        st = None
                    except RemoteError as exc:
                        if exc.code != "unavailable":  # (JetStream electing a new leader)
                            raise
                        st = None
                    if st is not None and st.state in TERMINAL_STATES:
                        return st
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), 1.0)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
