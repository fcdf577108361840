"""A user-space link emulator: an asyncio TCP proxy with latency, jitter, bandwidth, loss and
cut/restore, for putting real agents behind realistic links without root or kernel netem.

Why a proxy: every byte an agent exchanges goes through its one NATS connection, so shaping
that TCP stream shapes everything the agent sees (heartbeats, offers, data, link probes).

Model, per direction of each proxied connection (the two directions are independent):

- the proxy reads chunks of at most 64 KiB (smaller under a bandwidth limit: ~10 ms of
  traffic) and stamps their arrival time;
- **bandwidth** is a virtual wire: a chunk starts "transmitting" when it arrived and the
  previous one finished, and takes `bytes * 8 / bandwidth` (pacing, one FIFO per direction);
- **latency** is added after transmission, plus **jitter** drawn uniformly from
  `[-jitter, +jitter]` (never below zero); a chunk is never delivered before the one ahead of
  it, so jitter delays but never reorders a TCP stream;
- **loss**: a TCP stream has no packets to drop, so loss is modelled as what TCP makes of it, a
  retransmission delay. `loss` is a per-segment probability (1460-byte segments); a chunk with
  at least one lost segment is delayed by one extra round trip (`2 * latency`, at least
  `MIN_LOSS_PENALTY_MS`), and everything behind it waits too (head-of-line blocking). TCP's
  congestion-window reaction to loss is not modelled;
- **cut** holds bytes instead of dropping them (dropping would corrupt the NATS protocol stream
  after a restore): no byte crosses in either direction, sockets stay open, new connections
  are accepted but not dialled upstream until the restore. Held bytes count against
  `cut_buffer_bytes` per direction; a direction that overflows it closes its connection (as a
  TCP connection eventually times out during a long partition). On restore, held chunks are
  transmitted again from the restore time (bandwidth and latency apply afresh). Bytes already
  handed to the kernel before the cut (at most one chunk per direction) still arrive;
- outside a cut, a direction holds at most about two bandwidth-delay products (64 KiB to
  4 MiB) and then stops reading, so TCP flow control pushes back on the sender.

Connection setup itself is not delayed (the SYN/ACK round trip is free); only bytes are.

`python -m sim.linkemu serve --spec FILE` runs several proxies in one process (the fleet
launcher uses it) with a JSON-lines control port for cut/restore/profile changes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from schemas.codec import DecodeError, decode, encode
from schemas.linkcontrol import LinkControl, LinkControlReply, LinkProfileFields, LinkStatus

log = logging.getLogger("mars.sim.linkemu")

MAX_CHUNK = 64 * 1024
MIN_CHUNK = 1460
SEGMENT_BYTES = 1460
#: Pacing granularity under a bandwidth limit: read about this much traffic at a time.
PACING_S = 0.010
MIN_LOSS_PENALTY_MS = 1.0
MIN_INFLIGHT = 64 * 1024
MAX_INFLIGHT = 4 * 1024 * 1024
DEFAULT_CUT_BUFFER = 8 * 1024 * 1024


@dataclass(frozen=True)
class LinkProfile:
    """One-way figures applied to each direction of a proxied connection."""

    latency_ms: float = 0.0  # one-way, added to each direction
    jitter_ms: float = 0.0  # uniform +-jitter per chunk, order preserved
    bandwidth_mbps: float | None = None  # per direction; None = unlimited
    loss: float = 0.0  # per-segment probability, modelled as a retransmission delay

    def __post_init__(self) -> None:
        for name in ("latency_ms", "jitter_ms", "loss"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be finite and >= 0, not {v}")
        if self.loss >= 1.0:
            raise ValueError(f"loss must be < 1, not {self.loss}")
        bw = self.bandwidth_mbps
        if bw is not None and (not math.isfinite(bw) or bw <= 0):
            raise ValueError(f"bandwidth_mbps must be > 0 or None, not {bw}")

    def then(self, other: LinkProfile) -> LinkProfile:
        """Two links in series: latencies and jitters add, the narrower bandwidth wins, a byte
        survives only if it survives both."""
        bws = [b for b in (self.bandwidth_mbps, other.bandwidth_mbps) if b is not None]
        return LinkProfile(
            latency_ms=self.latency_ms + other.latency_ms,
            jitter_ms=self.jitter_ms + other.jitter_ms,
            bandwidth_mbps=min(bws) if bws else None,
            loss=round(1.0 - (1.0 - self.loss) * (1.0 - other.loss), 12),
        )


@dataclass(slots=True)
class _Chunk:
    data: bytes | None  # None: end of stream
    arrival: float
    due: float = 0.0


@dataclass(slots=True)
class DirectionStats:
    bytes_in: int = 0
    bytes_out: int = 0
    chunks: int = 0
    lossy_chunks: int = 0


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Pipe:
    """One direction of one connection: a reader that schedules, a writer that delivers."""

    def __init__(
        self,
        link: LinkProxy,
        conn: _Conn,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        stats: DirectionStats,
    ) -> None:
        self.link = link
        self.conn = conn
        self.src = src
        self.dst = dst
        self.stats = stats
        self.queue: deque[_Chunk] = deque()
        self.queued_bytes = 0
        self.wire_free = 0.0
        self.last_due = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._space = asyncio.Event()

    # -- timing model (pure arithmetic on the loop clock) -------------------------------------
    def _schedule(self, chunk: _Chunk) -> None:
        p = self.link.profile
        n = len(chunk.data) if chunk.data is not None else 0
        start = max(chunk.arrival, self.wire_free)
        if p.bandwidth_mbps is not None:
            start += n * 8.0 / (p.bandwidth_mbps * 1e6)
        self.wire_free = start
        delay_ms = p.latency_ms
        if p.jitter_ms > 0:
            delay_ms = max(0.0, delay_ms + self.link.rng.uniform(-p.jitter_ms, p.jitter_ms))
        if p.loss > 0 and n > 0:
            segments = math.ceil(n / SEGMENT_BYTES)
            if self.link.rng.random() < 1.0 - (1.0 - p.loss) ** segments:
                delay_ms += max(2.0 * p.latency_ms, MIN_LOSS_PENALTY_MS)
                self.stats.lossy_chunks += 1
        chunk.due = max(start + delay_ms / 1e3, self.last_due)
        self.last_due = chunk.due

    def reschedule(self, now: float) -> None:
        """After a restore: what was held is sent again from now."""
        self.wire_free = now
        self.last_due = 0.0
        for c in self.queue:
            c.arrival = max(c.arrival, now)
            self._schedule(c)

    def _inflight_limit(self) -> int:
        p = self.link.profile
        if p.bandwidth_mbps is None:
            return MAX_INFLIGHT
        bdp = p.bandwidth_mbps * 1e6 / 8 * max(2 * (p.latency_ms + p.jitter_ms) / 1e3, 0.05)
        return int(min(max(2 * bdp, MIN_INFLIGHT), MAX_INFLIGHT))

    def _read_size(self) -> int:
        bw = self.link.profile.bandwidth_mbps
        if bw is None:
            return MAX_CHUNK
        return int(min(max(bw * 1e6 / 8 * PACING_S, MIN_CHUNK), MAX_CHUNK))

    # -- wake-ups ------------------------------------------------------------------------------
    def poke(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        self._space.set()

    async def _wait(self, deadline: float | None) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._wake = fut
        handle = None
        if deadline is not None:
            handle = loop.call_at(deadline, _resolve, fut)
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._wake = None

    # -- the two loops -------------------------------------------------------------------------
    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.link.is_cut and self.queued_bytes >= self._inflight_limit():
                self._space.clear()
                await self._space.wait()
                continue
            data = await self.src.read(self._read_size())
            chunk = _Chunk(data or None, loop.time())
            if data:
                self.stats.bytes_in += len(data)
                self.stats.chunks += 1
                if self.link.is_cut and self.queued_bytes + len(data) > self.link.cut_buffer_bytes:
                    log.info("link %s: cut buffer overflow, closing a connection", self.link.name)
                    self.link.overflows += 1
                    self.conn.abort()
                    return
                self.queued_bytes += len(data)
            self._schedule(chunk)
            self.queue.append(chunk)
            self.poke()
            if not data:
                return

    async def deliver_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.queue or self.link.is_cut:
                await self._wait(None)
                continue
            head = self.queue[0]
            if head.due > loop.time():
                await self._wait(head.due)
                continue
            self.queue.popleft()
            if head.data is None:
                if self.dst.can_write_eof():
                    with contextlib.suppress(OSError):
                        self.dst.write_eof()
                return
            self.queued_bytes -= len(head.data)
            self.dst.write(head.data)
            await self.dst.drain()
            self.stats.bytes_out += len(head.data)
            self._space.set()


class _Conn:
    """One proxied TCP connection: client side, upstream side, two pipes."""

    def __init__(self, link: LinkProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.link = link
        self.c_reader = reader
        self.c_writer = writer
        self.u_writer: asyncio.StreamWriter | None = None
        self.pipes: list[_Pipe] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.up = DirectionStats()
        self.down = DirectionStats()

    def abort(self) -> None:
        for w in (self.c_writer, self.u_writer):
            if w is not None:
                w.transport.abort()
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()

    async def run(self) -> None:
        link = self.link
        try:
            await link.wait_up()
            try:
                u_reader, self.u_writer = await asyncio.open_connection(
                    link.target_host, link.target_port
                )
            except OSError as exc:
                log.info("link %s: upstream connect failed: %s", link.name, exc)
                return
            self.pipes = [
                _Pipe(link, self, self.c_reader, self.u_writer, self.up),
                _Pipe(link, self, u_reader, self.c_writer, self.down),
            ]
            for p in self.pipes:
                self.tasks.append(asyncio.create_task(p.read_loop()))
                self.tasks.append(asyncio.create_task(p.deliver_loop()))
            await asyncio.gather(*self.tasks)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # a sibling pipe aborted the connection: fine; the proxy stopping: propagate
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise
        finally:
            self.abort()


class LinkProxy:
    """A TCP proxy that shapes every byte crossing it (see the module docstring)."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        profile: LinkProfile = LinkProfile(),  # frozen, so a shared default is safe
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        seed: int | None = None,
        name: str = "",
        cut_buffer_bytes: int = DEFAULT_CUT_BUFFER,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.profile = profile
        self.listen_host = listen_host
        self.name = name or f"{target_host}:{target_port}"
        self.cut_buffer_bytes = cut_buffer_bytes
        self.rng = random.Random(seed)
        self.overflows = 0
        self.stopping = False
        self._listen_port = listen_port
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._up = asyncio.Event()
        self._up.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.listen_host, self._listen_port)
        self._listen_port = int(self._server.sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("LinkProxy not started")
        return self._listen_port

    @property
    def url(self) -> str:
        return f"nats://{self.listen_host}:{self.port}"

    @property
    def is_cut(self) -> bool:
        return not self._up.is_set()

    async def wait_up(self) -> None:
        """Until the link is not cut."""
        await self._up.wait()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def stats(self) -> dict[str, int]:
        """Bytes seen from clients (up) and from the target (down), over live connections."""
        return {
            "up_in": sum(c.up.bytes_in for c in self._conns),
            "up_out": sum(c.up.bytes_out for c in self._conns),
            "down_in": sum(c.down.bytes_in for c in self._conns),
            "down_out": sum(c.down.bytes_out for c in self._conns),
        }

    def set_profile(self, profile: LinkProfile) -> None:
        """Applies to bytes that arrive from now on; queued ones keep their schedule."""
        self.profile = profile
        self._poke_all()

    def cut(self) -> None:
        """Partition: sockets stay open, bytes are held (not dropped) up to the cut buffer,
        new connections are accepted but not dialled upstream."""
        self._up.clear()
        self._poke_all()

    def restore(self) -> None:
        """Heal the partition: held bytes are sent again from now, in order."""
        if self._up.is_set():
            return
        self._up.set()
        now = asyncio.get_running_loop().time()
        for c in self._conns:
            for p in c.pipes:
                p.reschedule(now)
        self._poke_all()

    def _poke_all(self) -> None:
        for c in self._conns:
            for p in c.pipes:
                p.poke()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stopping:
            writer.transport.abort()
            return
        conn = _Conn(self, reader, writer)
        self._conns.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        except asyncio.CancelledError:
            # stop() cancels handler tasks; ending them cancelled makes 3.11's streams callback
            # log a spurious traceback, and nothing awaits them but stop() itself
            pass
        finally:
            self._conns.discard(conn)
            if task is not None:
                self._tasks.discard(task)

    async def stop(self) -> None:
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for c in list(self._conns):
            c.abort()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def __aenter__(self) -> LinkProxy:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


# -- the supervisor: many proxies in one process ------------------------------------------------
@dataclass
class LinkSpecEntry:
    """One proxy of a supervisor spec (JSON): a name, where it forwards, how it shapes."""

    name: str
    target_host: str
    target_port: int
    profile: LinkProfile = field(default_factory=LinkProfile)
    seed: int | None = None


def profile_from_dict(d: dict[str, Any]) -> LinkProfile:
    allowed = {"latency_ms", "jitter_ms", "bandwidth_mbps", "loss"}
    unknown = set(d) - allowed
    if unknown:
        raise ValueError(f"unknown link profile fields: {sorted(unknown)}")
    return LinkProfile(**d)


def profile_to_dict(p: LinkProfile) -> dict[str, Any]:
    return asdict(p)


def write_spec(path: Path, links: Sequence[LinkSpecEntry], ready: Path) -> None:
    body = {
        "ready": str(ready),
        "links": [
            {
                "name": e.name,
                "target_host": e.target_host,
                "target_port": e.target_port,
                "profile": profile_to_dict(e.profile),
                "seed": e.seed,
            }
            for e in links
        ],
    }
    path.write_text(json.dumps(body, indent=2) + "\n")


async def _control(
    proxies: dict[str, LinkProxy], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """JSON lines: a `LinkControl` request, a `LinkControlReply` (an error code on bad input)."""
    try:
        while line := await reader.readline():
            writer.write(encode(_answer(proxies, line), "json") + b"\n")
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError, ValueError):
        pass  # ValueError: a line over the stream's limit; the connection just ends
    finally:
        writer.close()


def _answer(proxies: dict[str, LinkProxy], line: bytes) -> LinkControlReply:
    try:
        req = decode(line, LinkControl, "json")
    except DecodeError as exc:
        return LinkControlReply(ok=False, code=exc.code, error=exc.message[:2048])
    if req.link is not None and req.link not in proxies:
        return LinkControlReply(ok=False, code="not_found", error=f"no link {req.link!r}")
    names = [req.link] if req.link is not None else list(proxies)
    targets = [proxies[n] for n in names]
    if req.op == "cut":
        for p in targets:
            p.cut()
    elif req.op == "restore":
        for p in targets:
            p.restore()
    elif req.op == "profile":
        if req.profile is None:
            return LinkControlReply(ok=False, code="invalid", error="profile needs a profile")
        prof = LinkProfile(**req.profile.model_dump())
        for p in targets:
            p.set_profile(prof)
    return LinkControlReply(
        ok=True,
        links={
            n: LinkStatus(
                port=proxies[n].port,
                cut=proxies[n].is_cut,
                connections=proxies[n].connections,
                profile=LinkProfileFields(**profile_to_dict(proxies[n].profile)),
            )
            for n in names
        },
    )


def _write_ready(path: str, ready: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(ready) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


async def serve(spec: dict[str, Any]) -> None:
    """Start every proxy of the spec, write the ready file, run until SIGTERM/SIGINT."""
    proxies: dict[str, LinkProxy] = {}
    for e in spec["links"]:
        proxies[e["name"]] = LinkProxy(
            e["target_host"],
            int(e["target_port"]),
            profile_from_dict(e.get("profile") or {}),
            seed=e.get("seed"),
            name=e["name"],
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    control = await asyncio.start_server(
        lambda r, w: _control(proxies, r, w), "127.0.0.1", int(spec.get("control_port", 0))
    )
    try:
        for p in proxies.values():
            await p.start()
        ready = {
            "pid": os.getpid(),
            "control_port": int(control.sockets[0].getsockname()[1]),
            "links": {n: p.port for n, p in proxies.items()},
        }
        _write_ready(str(spec["ready"]), ready)
        await stop.wait()
    finally:
        control.close()
        for p in proxies.values():
            await p.stop()


async def control_request(port: int, req: LinkControl, timeout: float = 5.0) -> LinkControlReply:
    """One request to a supervisor's control port."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(encode(req, "json") + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        return decode(line, LinkControlReply, "json")
    finally:
        writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.linkemu", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve", help="run the proxies of a spec file until SIGTERM")
    sv.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.cmd == "serve":
        asyncio.run(serve(json.loads(Path(args.spec).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
