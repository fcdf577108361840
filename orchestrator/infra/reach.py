"""Reaching the NATS server as a service starts (`mars agent`, `mars orchestrator`).

A service's own connection reconnects for ever once it has been up (a server restart is
routine), and tried the same way from the start: a wrong URL then showed nothing and the
process ran for good. Before its service starts, the command tries the URL once with a
connection of its own: out of reach, it says so on stderr and exits, or, asked to
(`--retry-connect`, for a supervisor such as systemd), says so and tries again with a growing
wait, until the server answers or the process is told to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable

import nats
import nats.errors

from orchestrator.infra import eventloop
from transport import connect

#: The first wait before trying again, doubled after each failure up to the last.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
#: How long one try waits for the server's greeting.
CONNECT_TIMEOUT_S = 5.0


class Unreachable(Exception):
    """The server did not accept a connection (and trying again was not asked for)."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def why_not(url: str) -> str | None:
    """Why the server at `url` does not accept a connection now, or None when it does."""
    seen: list[Exception] = []

    async def note(exc: Exception) -> None:  # nats-py's own prints a traceback
        seen.append(exc)

    try:  # (nats-py tries a server at least twice, however few attempts it is given)
        nc = await nats.connect(
            connect.servers(url), name="mars-reach", allow_reconnect=False,
            max_reconnect_attempts=1, reconnect_time_wait=0,
            connect_timeout=CONNECT_TIMEOUT_S, error_cb=note,
            **connect.options(),
        )  # fmt: skip
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        cause = seen[0] if seen else exc
        return f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    with contextlib.suppress(Exception):
        await nc.close()
    return None


async def reach(
    url: str, stop: asyncio.Event, *, retry: bool, say: Callable[[str], None] = _say
) -> bool:
    """Wait until the server at `url` accepts a connection: True once it does, False when
    `stop` was set first. Without `retry`, the first failure raises Unreachable; with it,
    each is said (`say`, stderr by default) with the wait before the next try."""
    wait = RETRY_FIRST_S
    failed = False
    while not stop.is_set():
        why = await why_not(url)
        if why is None:
            if failed:
                say(f"reached NATS at {url}")
            return True
        if not retry:
            raise Unreachable(f"cannot reach NATS at {url}: {why}")
        failed = True
        say(f"cannot reach NATS at {url}: {why}; trying again in {wait:g} s")
        await eventloop.wait_event(stop, wait)
        wait = min(2 * wait, RETRY_MAX_S)
    return False
