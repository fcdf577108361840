"""`settle`: a subscription made on one connection is live for every other one once it returns.

CI once failed on a probe request answered "no responders" right after the agent's start had
flushed its subscriptions: nats-py writes flush()'s PING ahead of the SUBs still queued.
"""

from __future__ import annotations

from typing import Any

import nats
from nats.aio.msg import Msg

from transport.rpc import settle


async def test_settle_puts_a_ping_behind_every_queued_command(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    written: list[bytes] = []
    transport: Any = nc._transport  # spied on, not replaced: the bytes still go to the server
    write, writelines = transport.write, transport.writelines

    def spy_write(payload: bytes) -> Any:
        written.append(bytes(payload))
        return write(payload)

    def spy_writelines(payloads: list[bytes]) -> Any:
        written.extend(bytes(p) for p in payloads)
        return writelines(payloads)

    transport.write, transport.writelines = spy_write, spy_writelines
    try:
        await nc.subscribe("settle.probe")
        await settle(nc)
        stream = b"".join(written)
        sub_at = stream.index(b"SUB settle.probe")
        assert b"PING\r\n" in stream[sub_at:], stream  # a PONG after this one means the SUB is in
    finally:
        transport.write, transport.writelines = write, writelines
        await nc.close()


async def test_a_request_right_after_settle_finds_its_responder(nats_url: str) -> None:
    caller = await nats.connect(nats_url)
    server = await nats.connect(nats_url)

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    try:
        for i in range(50):
            await server.subscribe(f"settle.echo.{i}", cb=echo)
            await settle(server)
            rep = await caller.request(f"settle.echo.{i}", str(i).encode(), timeout=2.0)
            assert rep.data == str(i).encode()
    finally:
        await caller.close()
        await server.close()
