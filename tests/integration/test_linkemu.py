"""The link emulator on loopback: latency and bandwidth within 10% of what was asked, order kept
under jitter, loss as a retransmission delay, and a cut that is silent but keeps sockets open."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.msg import Msg

from sim.linkemu import LinkProfile, LinkProxy
from transport.rpc import settle

pytestmark = pytest.mark.integration


class Sink:
    """A TCP server that echoes (or only counts) and remembers what it got and when."""

    def __init__(self, *, echo: bool = True, send_on_connect: int = 0) -> None:
        self.echo = echo
        self.send_on_connect = send_on_connect
        self.received = 0
        self.last_rx = 0.0
        self.got_all = asyncio.Event()
        self.expect = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Sink:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            if self.send_on_connect:
                w.write(b"d" * self.send_on_connect)
            while data := await r.read(65536):
                self.received += len(data)
                self.last_rx = time.monotonic()
                if self.expect and self.received >= self.expect:
                    self.got_all.set()
                if self.echo:
                    w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()


@pytest.fixture
async def echo() -> AsyncIterator[Sink]:
    async with Sink() as s:
        yield s


async def _rtts(port: int, n: int) -> list[float]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    out = []
    try:
        for i in range(n):
            msg = f"ping{i:04d}".encode()
            t0 = time.monotonic()
            w.write(msg)
            await w.drain()
            assert await asyncio.wait_for(r.readexactly(len(msg)), 5) == msg
            out.append((time.monotonic() - t0) * 1e3)
    finally:
        w.close()
    return out


async def test_added_latency_within_10_percent(echo: Sink) -> None:
    async with LinkProxy("127.0.0.1", echo.port, LinkProfile(latency_ms=40.0)) as proxy:
        rtts = await _rtts(proxy.port, 9)
    median = statistics.median(rtts)
    assert 72.0 <= median <= 88.0, rtts  # 2 x 40 ms, +-10%
    assert min(rtts) >= 80.0  # never earlier than asked


async def test_bandwidth_within_10_percent_both_directions() -> None:
    size = 3_000_000
    async with (
        Sink(echo=False, send_on_connect=size) as sink,
        LinkProxy("127.0.0.1", sink.port, LinkProfile(bandwidth_mbps=20.0)) as proxy,
    ):
        sink.expect = size
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)

        async def upload() -> float:
            t0 = time.monotonic()
            w.write(b"u" * size)
            await w.drain()
            await asyncio.wait_for(sink.got_all.wait(), 10)
            return sink.last_rx - t0

        async def download() -> float:
            t0 = time.monotonic()
            await asyncio.wait_for(r.readexactly(size), 10)
            return time.monotonic() - t0

        up_s, down_s = await asyncio.gather(upload(), download())
        w.close()
    for secs in (up_s, down_s):
        mbps = size * 8 / secs / 1e6
        assert 18.0 <= mbps <= 22.0, (up_s, down_s)


async def test_jitter_never_reorders_and_loss_delays(echo: Sink) -> None:
    prof = LinkProfile(latency_ms=5.0, jitter_ms=5.0)
    async with LinkProxy("127.0.0.1", echo.port, prof, seed=7) as proxy:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        sent = b"".join(f"{i:05d};".encode() for i in range(400))
        for i in range(0, len(sent), 60):  # many small writes, each a chunk with its own jitter
            w.write(sent[i : i + 60])
            await w.drain()
        assert await asyncio.wait_for(r.readexactly(len(sent)), 5) == sent
        w.close()
    # loss 0.99 on a one-segment message: nearly always one extra RTT per direction
    lossy = LinkProfile(latency_ms=10.0, loss=0.99)
    async with LinkProxy("127.0.0.1", echo.port, lossy, seed=1) as proxy:
        median = statistics.median(await _rtts(proxy.port, 5))
    assert 54.0 <= median <= 66.0  # 2 x (10 + 2 x 10) ms


async def test_cut_is_silent_but_open_then_restores(echo: Sink) -> None:
    async with LinkProxy("127.0.0.1", echo.port, LinkProfile(latency_ms=2.0)) as proxy:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"a")
        assert await asyncio.wait_for(r.readexactly(1), 5) == b"a"
        proxy.cut()
        w.write(b"bb")
        await w.drain()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r.read(1), 0.4)
        assert echo.received == 1  # the server saw nothing of "bb"
        assert proxy.connections == 1 and not r.at_eof()
        # a connection opened during the cut is accepted but silent too
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
        w2.write(b"c")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(r2.read(1), 0.2)
        assert proxy.connections == 2 and echo.received == 1
        proxy.restore()
        assert await asyncio.wait_for(r.readexactly(2), 5) == b"bb"
        assert await asyncio.wait_for(r2.readexactly(1), 5) == b"c"
        w.close()
        w2.close()


async def test_cut_buffer_overflow_closes_the_connection(echo: Sink) -> None:
    async with LinkProxy("127.0.0.1", echo.port, cut_buffer_bytes=64 * 1024) as proxy:
        r, w = await asyncio.open_connection("127.0.0.1", proxy.port)
        w.write(b"x")
        assert await asyncio.wait_for(r.readexactly(1), 5) == b"x"
        proxy.cut()
        w.write(b"y" * (256 * 1024))
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(r.readexactly(1), 5)  # EOF or reset, never a byte
        assert proxy.overflows == 1
        w.close()


async def test_nats_client_behind_a_cut_link(nats_url: str) -> None:
    host, port = nats_url.removeprefix("nats://").split(":")
    async with LinkProxy(host, int(port), LinkProfile(latency_ms=5.0)) as proxy:
        direct = await nats.connect(nats_url)
        disconnected = asyncio.Event()

        async def on_disconnect() -> None:
            disconnected.set()

        behind = await nats.connect(proxy.url, disconnected_cb=on_disconnect, allow_reconnect=False)
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_msg(msg: Msg) -> None:
            await got.put(msg.data)

        await direct.subscribe("t.cut", cb=on_msg)
        await settle(direct)
        await behind.publish("t.cut", b"before")
        assert await asyncio.wait_for(got.get(), 5) == b"before"
        proxy.cut()
        await behind.publish("t.cut", b"during")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(got.get(), 0.5)
        assert behind.is_connected and not disconnected.is_set() and proxy.connections == 1
        proxy.restore()
        assert await asyncio.wait_for(got.get(), 5) == b"during"
        await behind.flush(timeout=5)
        assert not disconnected.is_set()
        await behind.close()
        await direct.close()


async def test_control_port_answers_bad_requests_with_a_code_and_keeps_serving() -> None:
    """The emulator's control protocol goes through schemas: garbage, a wrong shape, an
    unknown link or op each get `ok: false` with a code; good requests still work after."""
    import json

    from schemas.codec import decode
    from schemas.linkcontrol import LinkControl, LinkControlReply
    from sim.linkemu import _control, control_request

    async with LinkProxy("127.0.0.1", 9, LinkProfile(), name="a1") as proxy:
        proxies = {"a1": proxy}
        server = await asyncio.start_server(lambda r, w: _control(proxies, r, w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            bad = [b"not json", b"[1, 2]", json.dumps({"op": "explode"}).encode(),
                   json.dumps({"op": "cut", "link": "zz"}).encode(),
                   json.dumps({"op": "profile", "profile": {"loss": 2.0}}).encode()]  # fmt: skip
            codes = []
            for line in bad:
                writer.write(line + b"\n")
                await writer.drain()
                rep = decode(await reader.readline(), LinkControlReply, "json")
                assert not rep.ok and rep.error
                codes.append(rep.code)
            assert codes == ["bad_request", "bad_request", "invalid", "not_found", "invalid"]
            writer.close()
            assert not proxy.is_cut
            cut = await control_request(port, LinkControl(op="cut", link="a1"))
            assert cut.ok and cut.links["a1"].cut and proxy.is_cut
            slow = LinkControl.model_validate({"op": "profile", "profile": {"latency_ms": 50}})
            shown = await control_request(port, slow)
            assert shown.ok and proxy.profile.latency_ms == 50.0
        finally:
            server.close()
            await server.wait_closed()
