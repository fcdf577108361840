"""One large task output from agent A to agent B through the data plane, against plain NATS.

    python -m benchmarks.data_transfer [--size-mb 100] [--repeat 3] [--set KEY=VALUE ...]

One embedded nats-server (JetStream on) and two real agents (`edge_agent.service.Agent`), each
a process of its own, on loopback. The benchmark offers and commits, as an orchestrator would,
a consumer task on B and a synthetic producer task on A whose output (`--size-mb` MB of bytes,
1 MB = 10^6 B) goes to that consumer: above `object_threshold_bytes`, so through the real
object-store path (A keeps it, puts it into `MARS_DATA` in `object_chunk_bytes` chunks and
sends B a reference; B reads the object and checks its size and sha256). The time is measured
from the moment A's executor returns the output (before A hashes it) to the moment B's core
has the verified input (`AgentCore.deliver` accepted it), on the host's monotonic clock (one
clock for every process of one host). Agent settings are the defaults (`--set` changes one
for both agents, e.g. `--set object_chunk_bytes=1048576`).

In the same run, alternating with the MARS transfers, the reference: the same bytes published
by A's process in chunks of the server's `max_payload` (4 MiB on MARS's embedded server) on a
plain core NATS connection to a subscriber on another connection in B's process, timed from
the first publish to the moment the subscriber holds every byte, joined in one buffer. No
JetStream, no hashing; the subscriber answers each chunk and the publisher keeps at most 8
unanswered (32 MiB: without a window the server cuts off a subscriber that falls 64 MB
behind as slow). That is about the most this Python's NATS client moves between two
processes through this server, and a bound for anything built on it.

Each figure is the median of `--repeat` runs (best also shown), with the CPU seconds each
process spent over the run (A, B, nats-server), and where a MARS transfer's time went, step
by step; goal: MARS >= 0.5 of plain NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import psutil
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from benchmarks.common import progress, table
from edge_agent.config import AgentConfig
from edge_agent.core import Job
from edge_agent.executors import Output
from edge_agent.retention import Retained
from edge_agent.service import Agent
from orchestrator.infra import eventloop
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.infra.procs import terminate_as_interrupt, tied_to_caller
from schemas import subjects
from schemas.limits import MAX_OUTPUT_BYTES
from schemas.pipeline import MediaType, TaskSpec
from schemas.placement import (
    CommitCommand,
    ConsumerRef,
    DataAck,
    DataTransfer,
    InputRef,
    OfferReply,
    TaskOffer,
)
from transport.rpc import request

MB = 1_000_000
GOAL = 0.5
CONTROL = "bench.data_transfer"
DEVICE = "cpu0"
#: Pause before each measurement: the last one's clean-up (the object deleted, the output
#: written to disk) is not charged to the next.
PAUSE_S = 1.0
#: Settings of both agents: nothing measured in the background, one emulated CPU.
QUIET = {
    "probe_cpu": False,
    "probe_gpus": False,
    "probe_accelerators": False,
    "devices": [{"device_id": DEVICE, "kind": "cpu", "slots": 1, "gflops": 10.0,
                 "emulated": True}],
    "allowed_kinds": ["synthetic"],
    "link_probe_every_s": 0,
    "recalibrate_every_s": 0,
}  # fmt: skip
#: Phases of one MARS transfer, as (label, from mark, to mark); marks are taken in A (out: the
#: executor returned the output; keep*, put*) and in B (get*, delivered). A large output's
#: put begins while A hashes it: those two phases overlap.
PHASES = [
    ("output to its put (A)", "out", "put0"),
    ("object put (A)", "put0", "put1"),
    ("sha256 + keep, beside the put (A)", "out", "keep1"),
    ("reference to B", "put1", "get0"),
    ("object get (B)", "get0", "get1"),
    ("check + deliver (B)", "get1", "delivered"),
]


A_MARKS = ("out", "keep0", "keep1", "put0", "put1", "acked")
B_MARKS = ("get0", "get1", "delivered")


# -- pure helpers ---------------------------------------------------------------------------------
def setting(text: str) -> tuple[str, Any]:
    """A `--set KEY=VALUE` option: an agent config key and its value (YAML-ish: a number or
    a boolean where it reads as one), checked against `AgentConfig`."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key not in AgentConfig.model_fields:
        raise argparse.ArgumentTypeError(f"no agent setting {key!r}")
    value: Any = raw.strip()
    for parse in (int, float):
        try:
            value = parse(value)
            break
        except ValueError:
            continue
    if value in ("true", "false"):
        value = value == "true"
    try:
        AgentConfig.model_validate({**QUIET, key: value})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{key}={raw}: {exc}") from None
    return key, value


def size_mb(text: str) -> int:
    """`--size-mb`: a size in MB (10^6 B) a task may output, as bytes."""
    try:
        mb = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of MB: {text!r}") from None
    nbytes = round(mb * MB)
    if not 1 <= nbytes <= MAX_OUTPUT_BYTES:
        raise argparse.ArgumentTypeError(
            f"{text} MB: a task output is 1 B to {MAX_OUTPUT_BYTES / MB:.0f} MB"
        )
    return nbytes


def mb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds if seconds > 0 else float("nan")


def ratio_line(mars_s: float, plain_s: float, best: tuple[float, float] | None = None) -> str:
    """The verdict: MARS's throughput over plain NATS's, from their (median) times, against
    the goal; `best`: the two best times, whose ratio is shown too."""
    ratio = plain_s / mars_s if mars_s > 0 else float("nan")
    verdict = "met" if ratio >= GOAL else "NOT met"
    line = f"MARS / plain NATS: {ratio:.2f} (goal >= {GOAL:.2f}: {verdict})"
    if best is not None:
        line += f"; best runs: {best[1] / best[0]:.2f}"
    return line


@dataclass
class Run:
    wall_s: float
    #: CPU seconds each process spent over the run (A, B, nats-server).
    cpu_s: dict[str, float]
    #: Monotonic marks of a MARS run (empty for plain NATS).
    marks: dict[str, float] = field(default_factory=dict)


def median_run(runs: Sequence[Run]) -> Run:
    """The run of median wall time (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: r.wall_s)
    return ranked[(len(ranked) - 1) // 2]


def min_wall(runs: Sequence[Run]) -> float:
    return min(r.wall_s for r in runs)


def phase_rows(runs: Sequence[Run]) -> list[list[object]]:
    """Each phase's median milliseconds over the MARS runs."""
    rows: list[list[object]] = []
    for label, a, b in PHASES:
        spans = [r.marks[b] - r.marks[a] for r in runs if a in r.marks and b in r.marks]
        if spans:
            rows.append([label, statistics.median(spans) * 1e3])
    return rows


def report(nbytes: int, mars: Sequence[Run], plain: Sequence[Run], note: str) -> str:
    m, p = median_run(mars), median_run(plain)
    procs = ["A", "B", "nats-server"]

    def row(name: str, runs: Sequence[Run], med: Run) -> list[object]:
        best = min_wall(runs)
        cpu = [med.cpu_s.get(k, float("nan")) for k in procs]
        return [name, mb_per_s(nbytes, med.wall_s), mb_per_s(nbytes, best),
                med.wall_s, *cpu, sum(cpu)]  # fmt: skip

    head = ["", "MB/s", "best MB/s", "median s", "CPU s A", "CPU s B", "CPU s server", "CPU s"]
    lines = [
        f"{nbytes / MB:g} MB from agent A to agent B, {note}; median of {len(mars)} runs",
        table([row("MARS data plane", mars, m), row("plain NATS", plain, p)], head),
        ratio_line(m.wall_s, p.wall_s, (min_wall(mars), min_wall(plain))),
        "",
        "where a MARS transfer's time goes (median ms):",
        table(phase_rows(mars), ["phase", "ms"]),
    ]
    return "\n".join(lines)


# -- an agent process -------------------------------------------------------------------------
class Marks:
    """Monotonic marks per pipeline, and a way to wait for one."""

    def __init__(self) -> None:
        self.at: dict[str, dict[str, float]] = {}
        self._events: dict[tuple[str, str], asyncio.Event] = {}
        #: Objects being read now, and a flag set whenever none is.
        self.reading = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def mark(self, pipeline_id: str, name: str) -> None:
        """Note the first time of `name` (a second get of the same input, say, keeps it)."""
        self.at.setdefault(pipeline_id, {}).setdefault(name, time.monotonic())
        self._event(pipeline_id, name).set()

    def _event(self, pipeline_id: str, name: str) -> asyncio.Event:
        return self._events.setdefault((pipeline_id, name), asyncio.Event())

    async def wait(self, pipeline_id: str, name: str, timeout: float) -> dict[str, float]:
        await asyncio.wait_for(self._event(pipeline_id, name).wait(), timeout)
        return self.at[pipeline_id]


def instrument(agent: Agent, marks: Marks) -> None:
    """Mark the data plane's steps: A's keep, put and the consumer's answer; B's get and the
    verified input its core took."""
    data, core = agent.data, agent.core
    keep, send_kept, deliver = data.keep, data.send_kept, core.deliver
    put, read = data.objects.put, data.objects.read
    run = agent._run

    async def timed_run(job: Job) -> Output:
        out = await run(job)
        marks.mark(job.offer.pipeline_id, "out")  # the task made its output: the clock starts
        return out

    def timed_keep(
        offer: TaskOffer,
        data: bytes,
        media_type: MediaType | None = None,
        sha256: str | None = None,
    ) -> Retained | None:
        marks.mark(offer.pipeline_id, "keep0")
        entry = keep(offer, data, media_type, sha256)
        marks.mark(offer.pipeline_id, "keep1")
        return entry

    async def timed_send_kept(entry: Retained | None) -> None:
        await send_kept(entry)
        if entry is not None:
            marks.mark(entry.pipeline_id, "acked")

    async def timed_put(
        js: Any, key: str, data: bytes, sha256: str | Awaitable[str] | None = None
    ) -> None:
        marks.mark(key.split("/")[0], "put0")
        await put(js, key, data, sha256)
        marks.mark(key.split("/")[0], "put1")

    async def timed_read(js: Any, key: str) -> tuple[bytes, str]:
        marks.mark(key.split("/")[0], "get0")
        marks.reading += 1
        marks.idle.clear()
        try:
            out = await read(js, key)
        finally:
            marks.reading -= 1
            if not marks.reading:
                marks.idle.set()
        marks.mark(key.split("/")[0], "get1")
        return out

    def timed_deliver(msg: DataTransfer, data: bytes | None = None) -> DataAck:
        got = deliver(msg, data)
        if got.ok:
            marks.mark(msg.pipeline_id, "delivered")
        return got

    agent._run = timed_run  # type: ignore[method-assign]
    data.keep = timed_keep  # type: ignore[method-assign]
    data.send_kept = timed_send_kept  # type: ignore[method-assign]
    data.objects.put = timed_put  # type: ignore[method-assign]
    data.objects.read = timed_read  # type: ignore[method-assign]
    core.deliver = timed_deliver  # type: ignore[method-assign]


class Plain:
    """Both ends of the plain NATS reference, on a connection of their own. The subscriber
    answers each chunk with an empty message; the publisher keeps at most `WINDOW` chunks
    unanswered. Without such a window a burst of 100 MB overruns the server's buffer toward
    a subscriber that is not scheduled fast enough, and the server cuts it off as slow."""

    WINDOW = 8

    def __init__(self, nc: NATS) -> None:
        self.nc = nc
        self.chunks: list[bytes] = []
        self.got = 0
        self.size = 0
        self.done = asyncio.Event()
        self.t_done = 0.0

    async def send(self, subject: str, size: int) -> float:
        payload = bytes(size)
        chunk = self.nc.max_payload
        credit = asyncio.Semaphore(self.WINDOW)
        acks = self.nc.new_inbox()

        async def on_ack(_: Msg) -> None:
            credit.release()

        sub = await self.nc.subscribe(acks, cb=on_ack)
        await self.nc.flush()
        t0 = time.monotonic()
        for off in range(0, size, chunk):
            await credit.acquire()
            await self.nc.publish(subject, payload[off : off + chunk], reply=acks)
        await self.nc.flush(timeout=60)
        await sub.unsubscribe()
        return t0

    async def listen(self, subject: str, size: int) -> None:
        self.chunks, self.got, self.size = [], 0, size
        self.done = asyncio.Event()
        nc = self.nc

        async def on_chunk(msg: Msg) -> None:
            await nc.publish(msg.reply, b"")
            self.chunks.append(msg.data)
            self.got += len(msg.data)
            if self.got >= self.size:
                whole = b"".join(self.chunks)
                self.t_done = time.monotonic()
                self.chunks = [whole]
                self.done.set()

        sub = await nc.subscribe(subject, cb=on_chunk, pending_bytes_limit=2 * size + (64 << 20))
        await sub.unsubscribe(limit=(size + nc.max_payload - 1) // nc.max_payload)
        await nc.flush()


async def serve(agent_id: str, url: str, sets: dict[str, Any]) -> None:
    """Run agent `agent_id` (instrumented) and answer the benchmark's control requests until
    SIGTERM or `stop`."""
    config = AgentConfig.model_validate({**QUIET, **sets})
    agent = Agent(url, config, agent_id=agent_id, calibrate=False)
    marks = Marks()
    instrument(agent, marks)
    await agent.start()
    assert agent.nc is not None and agent.data.js is not None
    await agent.data.objects.bucket(agent.data.js)  # the bucket exists before the first put
    plain = Plain(await nats.connect(url, name=f"bench-plain-{agent_id}"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def hello(_: dict[str, Any]) -> dict[str, Any]:
        return {"incarnation": agent.incarnation}

    async def wait_mark(req: dict[str, Any]) -> dict[str, Any]:
        return await marks.wait(req["pipeline_id"], req["mark"], req.get("timeout", 120.0))

    async def idle(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(marks.idle.wait(), req.get("timeout", 600.0))
        return {}

    async def plain_send(req: dict[str, Any]) -> dict[str, Any]:
        return {"t0": await plain.send(req["subject"], req["size"])}

    async def plain_listen(req: dict[str, Any]) -> dict[str, Any]:
        await plain.listen(req["subject"], req["size"])
        return {}

    async def plain_wait(req: dict[str, Any]) -> dict[str, Any]:
        await asyncio.wait_for(plain.done.wait(), req.get("timeout", 120.0))
        return {"t1": plain.t_done, "bytes": len(plain.chunks[0])}

    async def halt(_: dict[str, Any]) -> dict[str, Any]:
        stop.set()
        return {}

    handlers: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
        "hello": hello, "mark": wait_mark, "idle": idle, "plain_send": plain_send,
        "plain_listen": plain_listen, "plain_wait": plain_wait, "stop": halt,
    }  # fmt: skip

    async def on_control(msg: Msg) -> None:
        verb = msg.subject.rsplit(".", 1)[1]
        try:
            out = await handlers[verb](json.loads(msg.data or b"{}"))
        except Exception as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        await msg.respond(json.dumps(out).encode())

    running: set[asyncio.Task[None]] = set()

    async def spawned(msg: Msg) -> None:
        # each request in a task of its own: one waiting for a mark must not hold up the next
        task = asyncio.create_task(on_control(msg))
        running.add(task)
        task.add_done_callback(running.discard)

    await agent.nc.subscribe(f"{CONTROL}.{agent_id}.*", cb=spawned)
    await agent.nc.flush()
    try:
        await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await plain.nc.close()
        await agent.stop()


# -- the benchmark --------------------------------------------------------------------------------
class Bench:
    def __init__(self, nc: NATS, server: EmbeddedNats, pids: dict[str, int], size: int) -> None:
        self.nc = nc
        self.size = size
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        assert server.proc is not None
        self.procs["nats-server"] = psutil.Process(server.proc.pid)
        self.incarnation: dict[str, str] = {}

    async def ask(self, agent_id: str, verb: str, timeout: float = 150.0, **req: Any) -> Any:
        msg = await self.nc.request(
            f"{CONTROL}.{agent_id}.{verb}", json.dumps(req).encode(), timeout=timeout
        )
        out = json.loads(msg.data)
        if isinstance(out, dict) and "error" in out:
            raise RuntimeError(f"agent {agent_id}, {verb}: {out['error']}")
        return out

    def cpu(self) -> dict[str, float]:
        out = {}
        for name, p in self.procs.items():
            t = p.cpu_times()
            out[name] = t.user + t.system
        return out

    async def hello(self, agent_id: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.incarnation[agent_id] = (await self.ask(agent_id, "hello", 1.0))["incarnation"]
                return
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    def offer(self, agent_id: str, pid: str, task: TaskSpec, **routes: Any) -> TaskOffer:
        return TaskOffer(
            pipeline_id=pid, agent_id=agent_id, incarnation=self.incarnation[agent_id],
            device_id=DEVICE, token=1, task=task, **routes,
        )  # fmt: skip

    async def place(self, agent_id: str, offer: TaskOffer) -> None:
        reply = await request(self.nc, subjects.offer(agent_id), offer, OfferReply)
        if not reply.accepted:
            raise RuntimeError(f"{agent_id} refused {offer.task.id}: {reply.reason}")
        cmd = CommitCommand(pipeline_id=offer.pipeline_id, task_ids=[offer.task.id])
        await request(self.nc, subjects.commit(agent_id), cmd, CommitCommand)

    async def mars(self, n: int) -> Run:
        pid = f"dt{n}"
        sink = TaskSpec.model_validate(
            {"id": "sink", "run": {"kind": "synthetic", "seconds": 0.0}, "deps": ["src"]}
        )
        src = TaskSpec.model_validate({
            "id": "src", "output_bytes": self.size,
            "run": {"kind": "synthetic", "seconds": 0.0, "output_bytes": self.size},
        })  # fmt: skip
        await self.place("B", self.offer("B", pid, sink, inputs=[
            InputRef(task_id="src", agent_id="A", nbytes=self.size)
        ]))  # fmt: skip
        before = self.cpu()
        await self.place("A", self.offer("A", pid, src, consumers=[
            ConsumerRef(task_id="sink", agent_id="B")
        ]))  # fmt: skip
        got = await self.ask("B", "mark", pipeline_id=pid, mark="delivered")
        sent = await self.ask("A", "mark", pipeline_id=pid, mark="acked")
        cpu = {k: v - before[k] for k, v in self.cpu().items()}
        # a second read of the same object (a fetch for the input while the push's read was
        # under way) must not run into the next measurement
        await self.ask("B", "idle", 660.0)
        # each side's own marks (B keeps its consumer's empty output too, A takes no input)
        marks = {k: v for k, v in sent.items() if k in A_MARKS}
        marks.update((k, v) for k, v in got.items() if k in B_MARKS)
        return Run(marks["delivered"] - marks["out"], cpu, marks)

    async def plain(self, n: int) -> Run:
        subject = f"{CONTROL}.plain.{n}"
        await self.ask("B", "plain_listen", subject=subject, size=self.size)
        before = self.cpu()
        t0 = (await self.ask("A", "plain_send", subject=subject, size=self.size))["t0"]
        got = await self.ask("B", "plain_wait")
        cpu = {k: v - before[k] for k, v in self.cpu().items()}
        if got["bytes"] != self.size:
            raise RuntimeError(f"plain NATS: {got['bytes']} B arrived of {self.size}")
        return Run(got["t1"] - t0, cpu)


def start_agent(agent_id: str, url: str, sets: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "benchmarks.data_transfer", "--serve", agent_id,
            "--nats", url]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    with log.open("ab") as fh:
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
            preexec_fn=tied_to_caller(),
        )  # fmt: skip


async def run_bench(args: argparse.Namespace, server: EmbeddedNats, tmp: Path) -> str:
    procs = {
        aid: start_agent(aid, server.url, args.set_raw, tmp / f"agent-{aid}.log")
        for aid in ("A", "B")
    }
    nc = await nats.connect(server.url, name="bench-driver")
    try:
        bench = Bench(nc, server, {k: p.pid for k, p in procs.items()}, args.size)
        for aid in procs:
            await bench.hello(aid)
        mars: list[Run] = []
        plain: list[Run] = []
        for n in range(args.repeat):
            progress(f"run {n + 1}/{args.repeat}: MARS data plane")
            await asyncio.sleep(PAUSE_S)
            mars.append(await bench.mars(n))
            progress(f"  {mb_per_s(args.size, mars[-1].wall_s):.0f} MB/s; plain NATS")
            await asyncio.sleep(PAUSE_S)
            plain.append(await bench.plain(n))
            progress(f"  {mb_per_s(args.size, plain[-1].wall_s):.0f} MB/s")
        cfg = AgentConfig.model_validate({**QUIET, **args.sets})
        note = (
            f"agents as processes, loopback, nats-server GOMAXPROCS={server.procs}, "
            f"{eventloop.loop_name()}; object chunks {cfg.object_chunk_bytes >> 10} KiB"
            f"{' (--set)' if 'object_chunk_bytes' in args.sets else ''}, "
            f"plain NATS chunks {nc.max_payload >> 20} MiB"
        )
        for aid in procs:
            with contextlib.suppress(Exception):
                await bench.ask(aid, "stop", 5.0)
        return report(args.size, mars, plain, note)
    except BaseException:
        for aid in procs:
            with contextlib.suppress(Exception):
                progress(f"agent {aid} log:\n{(tmp / f'agent-{aid}.log').read_text()[-3000:]}")
        raise
    finally:
        await nc.close()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def sha256_rate(nbytes: int) -> float:
    data = bytes(nbytes)
    t0 = time.perf_counter()
    hashlib.sha256(data).digest()
    return mb_per_s(nbytes, time.perf_counter() - t0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", dest="size", type=size_mb, default=100 * MB,
                    help="the output's size in MB (10^6 B; default 100)")  # fmt: skip
    ap.add_argument("--repeat", type=int, default=3, help="runs of each; the median counts")
    ap.add_argument("--set", dest="set_raw", action="append", default=[], metavar="KEY=VALUE",
                    help="an agent setting for both agents (repeatable)")  # fmt: skip
    ap.add_argument("--serve", metavar="AGENT_ID", help=argparse.SUPPRESS)
    ap.add_argument("--nats", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    try:
        args.sets = dict(setting(s) for s in args.set_raw)
    except argparse.ArgumentTypeError as exc:
        ap.error(f"--set: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        eventloop.run(serve(args.serve, args.nats, args.sets))
        return 0
    before = os.getloadavg()
    with terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix="mars-dt-") as tmp:
        server = EmbeddedNats(store_dir=str(Path(tmp) / "nats")).start()
        try:
            out = eventloop.run(run_bench(args, server, Path(tmp)))
        finally:
            server.stop()
    after = os.getloadavg()
    print(out)
    print(f"\nsha256 here: {sha256_rate(args.size):,.0f} MB/s (one pass over the bytes); "
          f"{os.cpu_count()} cores, load average (1 min) {before[0]:.2f} before, "
          f"{after[0]:.2f} after")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
