"""Booking stress: many small pipelines through several orchestrator replicas, then an audit
of every revision ever written to the reservation bucket.

    python -m benchmarks.booking_stress [--orchestrators 2] [--agents 50]
        [--submissions 10000] [--concurrency 64] [--seed 1] [--priorities same|mixed]
        [--task-ms 1,5] [--kill-after S] [--cancel-every N]

1. An embedded nats-server. Before anything books, the KV bucket MARS_BOOKINGS (history 8) is
   created here, with a JetStream *mirror* of its backing stream `KV_MARS_BOOKINGS` that has no
   per-subject limit, so every revision any orchestrator ever wrote is kept (the bucket itself
   keeps only the last 8 per key). A sentinel write proves the mirror is live before the
   orchestrators start.
2. `--orchestrators` `mars orchestrator` processes (one API queue group) and one
   `mars sim agents` process with `--agents` agents whose devices are emulated.
3. `--submissions` random small pipelines (1-4 synthetic sleep tasks of 1-5 ms, or of
   `--task-ms`, random DAG shapes, seeded) through the API, at most `--concurrency` in
   flight (a slot is held from submit until the pipeline is terminal); the queue group
   spreads them over the replicas.
   Every failure is counted with its reason. `--priorities mixed` gives each pipeline, at
   random, a low preemptible priority (10), the default (100) or a high one (500), so
   higher-priority plans evict lower ones' windows while both replicas book: the same
   audit then covers evictions, and the report counts them and each class's outcomes.
   Tasks longer than the agents' `started_event_after_s` (50 ms; `--task-ms 20,120`) report
   their start, and their owners make a started task's window non-preemptible while the
   other replica books: the audit covers those writes too.
   `--kill-after S` SIGKILLs orchestrator-0 S seconds into the load: the others adopt its
   pipelines (their records) once its ownership leases lapse, and the client sends a submit
   that got no answer again under the same id, as a client of a dead replica does (never
   placed twice; a pipeline the dead replica claimed but never recorded is given up by its
   adopter and placed anew). Every pipeline must still end. `--restart-agents-after S` and
   `--restart-server-after S` restart the fleet or the broker instead; the three may be
   given together, and each happens at its own time (one the load outlasts is reported as
   never having happened).
   `--cancel-every N` cancels every Nth pipeline as soon as its submit is answered, through
   the API's queue group (so often through a replica that does not hold it): each must end
   as its cancel was answered (cancelled, or succeeded had it ended first), never refused.
4. Once every pipeline has ended, with the services still up, the bucket is read until no
   window in it is live: each is given back by its owner or, its owner dead and the pipeline
   not adopted, expires with its lease. One still live `LEASE_S` + 5 s later is a lease
   renewed for nothing (a leak), and fails the run; the report says how long it took.
5. The services stop, and the mirror is read in order. Per key: (a) revisions (the stream
   sequence of each mirrored message, which a mirror keeps equal to the source's sequence, i.e.
   the KV revision) strictly increase; (b) no revision holds two windows that overlap on one slot
   among the windows still live at the write's own timestamp (`double_booked(windows, now=ts)`;
   expired windows are dropped by the next writer, so liveness at the write's time counts).
   Any violation, or any revision the mirror missed, makes the exit status 1; so does an
   eviction notice, in a pipeline's placement log, naming a window its owner had made firm
   (a started task's) before it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import nats
import nats.errors
import psutil
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig, StreamConfig, StreamSource
from nats.js.errors import NoKeysError

from benchmarks.common import pct, progress, table
from orchestrator import eventloop
from orchestrator.client import Client
from orchestrator.natsserver import EmbeddedNats
from orchestrator.procs import spawn, stop_all, terminate_as_interrupt
from orchestrator.reservations.book import double_booked
from orchestrator.reservations.listing import read_bookings
from orchestrator.reservations.store import BUCKET
from orchestrator.service import LEASE_S
from schemas import subjects
from schemas.api import TERMINAL_STATES, StatusReply, SubmitReply, TaskStatus
from schemas.bookings import DeviceBookings
from schemas.codec import DecodeError, RemoteError, decode, encode
from schemas.events import PipelineEvent
from schemas.pipeline import PipelineSpec
from sim.fleet import synthetic_pipeline

BOOKINGS_HISTORY = 8
ORIGIN_STREAM = f"KV_{BUCKET}"
MIRROR_STREAM = "MARS_BOOKINGS_AUDIT"
KV_PREFIX = f"$KV.{BUCKET}."
SENTINEL_KEY = "bench.mirror-ready"
#: Waiting for the processes to come up, and for one pipeline to finish after its submit.
READY_TIMEOUT_S = 60.0
TERMINAL_TIMEOUT_S = 120.0
#: With a failure injected (`--kill-after`, `--restart-*-after`): how long a request waits for
#: its reply before it is sent again, how often, and the pause before asking again about an id
#: a replica is placing.
KILL_SUBMIT_TIMEOUT_S = 5.0
#: The failures `--restart-server-after`, `--kill-after` and `--restart-agents-after` inject;
#: given together, each happens at its own time.
FAULT_SERVER, FAULT_KILL, FAULT_AGENTS = "server", "kill", "agents"
MAX_RESUBMITS = 40
RESUBMIT_PAUSE_S = 0.5
#: With a failure injected, a pipeline whose end was not heard is asked after this long, and
#: again as often (as `Client.wait` does): an end published while this client was still
#: reconnecting after a server restart (2 s apart) is not heard. At 5 s, up to 5 s of that
#: wait was the client's, and the slowest pipelines of a server-restart run read ~10 s where
#: their owner had them done in ~6.
STATUS_POLL_S = 1.0
#: After the load, how long every booked window may stay live: the booking lease (windows of
#: a dead replica's pipelines that nobody adopted expire) and some.
UNBOOKED_WITHIN_S = LEASE_S + 5.0
UNSETTLED = "terminal event seen, but status never settled"
NOT_TERMINAL = "not terminal"
#: How long a replica's persisted copy of a pipeline may lag its terminal event.
STATUS_SETTLE_S = 10.0


# -- processes ----------------------------------------------------------------------------------
class Services:
    """`mars` child processes with their logs in one directory; all stopped on exit."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names: list[str] = []
        self._logs: list[IO[bytes]] = []
        #: other processes whose CPU time is counted with the children's (not stopped here)
        self.watched: dict[str, int] = {}
        self.killed: set[str] = set()
        self._args: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        #: CPU seconds of a child's earlier lives (`restart`), added to its count.
        self.cpu_before: dict[str, float] = {}

    def watch(self, name: str, pid: int) -> None:
        """Count `pid`'s CPU time too (the nats-server, the benchmark itself)."""
        self.watched[name] = pid

    def spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        fh = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 (closed in stop())
        self._logs.append(fh)
        self.procs.append(spawn(args, log=fh, env=env))
        self.names.append(name)
        self._args[name] = (list(args), env)

    def restart(self, name: str) -> None:
        """SIGKILL a child and start it again with the same arguments (a host that lost
        power and came back: the same agent ids, each with a new incarnation)."""
        i = self.names.index(name)
        used = self.cpu_seconds().get(name, 0.0)  # its life so far, counted on
        self.procs[i].kill()
        self.procs[i].wait()
        self.cpu_before[name] = used
        args, env = self._args[name]
        fh = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 (closed in stop())
        self._logs.append(fh)
        self.procs[i] = spawn(args, log=fh, env=env)

    def kill(self, name: str) -> None:
        """SIGKILL a child (a replica that dies without a word); `check` expects it gone."""
        self.procs[self.names.index(name)].kill()
        self.killed.add(name)

    def check(self) -> None:
        """Raise if a child has exited (they run until we stop them), unless it was killed."""
        for name, p in zip(self.names, self.procs, strict=True):
            if p.poll() is not None and name not in self.killed:
                raise RuntimeError(
                    f"{name} exited with {p.returncode}; log tail:\n{self.tail(name)}"
                )

    def cpu_seconds(self) -> dict[str, float]:
        """User+system CPU seconds each live child (and each watched process) has used so
        far."""
        out: dict[str, float] = {}
        pids = [*zip(self.names, (p.pid for p in self.procs), strict=True), *self.watched.items()]
        for name, pid in pids:
            with contextlib.suppress(psutil.Error):
                t = psutil.Process(pid).cpu_times()
                out[name] = self.cpu_before.get(name, 0.0) + t.user + t.system
        return out

    def tail(self, name: str, n: int = 2000) -> str:
        try:
            return (self.logdir / f"{name}.log").read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        stop_all(self.procs)
        for fh in self._logs:
            fh.close()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def log_dir(prefix: str) -> Iterator[Path]:
    """A temp directory for child logs, kept (and named) only when the run fails, when
    `keep_logs` was called, or with MARS_KEEP_LOGS set."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        progress(f"child process logs kept in {path}")
        raise
    else:
        marker = path / KEEP_MARKER
        if marker.exists():
            progress(f"child process logs kept in {path} ({marker.read_text()})")
        elif os.environ.get("MARS_KEEP_LOGS"):
            progress(f"child process logs kept in {path} (MARS_KEEP_LOGS)")
        else:
            shutil.rmtree(path, ignore_errors=True)


KEEP_MARKER = "KEPT-BECAUSE"


def keep_logs(path: Path, why: str) -> None:
    """Keep `log_dir`'s directory at the end of a run that did not fail, saying why."""
    (path / KEEP_MARKER).write_text(why)


async def api_instances(nc: NATS, window_s: float = 0.3) -> int:
    """How many API service instances answer a nats.micro PING within `window_s`."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    ids: set[str] = set()
    try:
        await nc.publish(f"$SRV.PING.{subjects.API_SERVICE}", b"", reply=inbox)
        loop = asyncio.get_running_loop()
        end = loop.time() + window_s
        while (left := end - loop.time()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            with contextlib.suppress(ValueError, TypeError, KeyError):
                ids.add(str(json.loads(msg.data)["id"]))
    finally:
        await sub.unsubscribe()
    return len(ids)


async def wait_ready(client: Client, services: Services, orchestrators: int, agents: int) -> None:
    """Until `orchestrators` API instances answer and `agents` agents are alive."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    seen = 0
    while (seen := await api_instances(client.nc)) < orchestrators:
        services.check()
        if loop.time() > deadline:
            raise RuntimeError(f"only {seen} of {orchestrators} orchestrators answered")
    progress(f"{seen} orchestrator replicas answer; waiting for {agents} agents")
    while True:
        services.check()
        alive = await client.wait_for_agents(agents, timeout=2.0)
        if alive >= agents:
            break
        if loop.time() > deadline:
            raise RuntimeError(f"only {alive} of {agents} agents became visible")
    progress(f"{alive} agents alive")


# -- pipeline outcomes --------------------------------------------------------------------------
class Terminals:
    """Terminal pipeline states from pipeline events: one subscription for every pipeline."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[PipelineEvent]] = {}
        self.sub: Any = None

    async def start(self, nc: NATS) -> None:
        self.sub = await nc.subscribe(subjects.ALL_PIPELINE_EVENTS, cb=self._on_event)

    async def stop(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()

    def expect(self, pipeline_id: str) -> asyncio.Future[PipelineEvent]:
        """Call before submitting, so an early terminal event is not missed."""
        fut: asyncio.Future[PipelineEvent] = asyncio.get_running_loop().create_future()
        self._waiting[pipeline_id] = fut
        return fut

    def forget(self, pipeline_id: str) -> None:
        self._waiting.pop(pipeline_id, None)

    async def _on_event(self, msg: Msg) -> None:
        try:
            ev = decode(msg.data, PipelineEvent)
        except DecodeError:
            return
        if ev.state not in TERMINAL_STATES:
            return
        fut = self._waiting.pop(ev.pipeline_id, None)
        if fut is not None and not fut.done():
            fut.set_result(ev)


@dataclass
class SettleStats:
    """How often a terminal event was followed by a status that was not terminal yet."""

    calls: int = 0
    stale: int = 0
    extra_polls: int = 0
    #: What each stale first answer was: the state it gave, or the error code.
    kinds: Counter[str] = field(default_factory=Counter)


SETTLE = SettleStats()


async def settled_status(client: Client, pipeline_id: str) -> StatusReply | None:
    """The pipeline's terminal status. A replica that does not own the pipeline answers from the
    record its owner persists *before* publishing the terminal event, so the first answer should
    be terminal; one that is not (a failed write being retried, a request that timed out under
    load) is counted, and polled again (with backoff and a deadline); None if it never is."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STATUS_SETTLE_S
    delay = 0.005
    last: StatusReply | None = None
    SETTLE.calls += 1
    polls = 0
    while True:
        answer = ""
        try:
            last = await client.status(pipeline_id)
            if last.state in TERMINAL_STATES:
                return last
            answer = last.state
        except RemoteError as exc:
            answer = exc.code
        except (TimeoutError, nats.errors.Error) as exc:
            answer = type(exc).__name__
        if polls == 0:
            SETTLE.stale += 1
            SETTLE.kinds[answer] += 1
        polls += 1
        SETTLE.extra_polls += 1
        if loop.time() + delay > deadline:
            return None
        await asyncio.sleep(delay)  # status polling with a deadline (no event for the KV copy)
        delay = min(delay * 2, 0.25)


@dataclass
class Outcome:
    pipeline_id: str
    tasks: int
    state: str
    reason: str = ""
    submit_s: float = float("nan")
    placed: int = 0
    status: StatusReply | None = None
    priority: int = 100
    #: From the submit request to the pipeline's terminal event (nan: none seen).
    done_s: float = float("nan")
    #: Submits sent again, with the same id, after one went unanswered or found the id being
    #: placed by a replica (`--kill-after`: what a client does when a replica dies).
    resubmits: int = 0
    #: Its status asked once more after the load, had it not settled (what it came to).
    later: str = ""
    #: That status, whatever its state (a pipeline that never ended: its own account).
    later_status: StatusReply | None = None
    #: With `--cancel-every`: what its cancel was answered (a state, or `refused <code>`).
    cancel: str = ""


def normalise_reason(reason: str) -> str:
    """Group failure reasons: ids and numbers vary, the kind of failure does not."""
    r = re.sub(r"\b[0-9a-f]{12,}\b", "<id>", reason)
    r = re.sub(r"\bbs\d+-\d+\b", "<pipeline>", r)
    r = re.sub(r"\d+(\.\d+)?", "#", r)
    return r[:160]


@dataclass
class LoadResult:
    outcomes: list[Outcome]
    wall_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    #: After every pipeline ended: seconds until no booked window was live any more, and the
    #: live windows left when the wait gave up (`wait_unbooked`).
    unbooked_s: float = float("nan")
    left_live: list[str] = field(default_factory=list)
    #: Each failure injected (`FAULT_*`), seconds into the load when it happened; one the load
    #: outlasted is missing.
    faults: dict[str, float] = field(default_factory=dict)
    #: With a failure injected: statuses that settled only when asked after the load.
    settled_late: int = 0


async def run_load(
    client: Client,
    specs: list[tuple[str, PipelineSpec]],
    concurrency: int,
    resubmit: bool = False,
    cancel: Collection[str] = (),
) -> LoadResult:
    terminals = Terminals()
    await terminals.start(client.nc)
    outcomes: list[Outcome] = []
    todo = iter(specs)
    total = len(specs)
    every = max(1, total // 20)
    counts: Counter[str] = Counter()
    t_start = time.perf_counter()

    def done(o: Outcome) -> None:
        outcomes.append(o)
        # no status settled (yet): asked again after the load, and counted by what it says then
        unsettled = o.status is None and o.state == "failed" and "refused" not in o.reason
        counts["no status yet" if unsettled else o.state] += 1
        n = len(outcomes)
        if n % every == 0 or n == total:
            el = time.perf_counter() - t_start
            progress(
                f"  {n}/{total} terminal in {el:.1f} s ({n / el:.0f}/s): "
                + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            )

    async def one(pid: str, spec: PipelineSpec) -> Outcome:
        out = Outcome(pid, len(spec.tasks), "failed", priority=spec.priority)
        fut = terminals.expect(pid)
        t0 = time.perf_counter()
        try:
            reply = await submit(pid, spec, out)
            out.submit_s = time.perf_counter() - t0
            out.placed = len(reply.plan)
        except RemoteError as exc:
            terminals.forget(pid)
            out.submit_s = time.perf_counter() - t0
            out.state = exc.envelope.code if exc.code == "unschedulable" else "failed"
            out.reason = f"submit refused ({exc.code}): {exc.envelope.message}"
            out.status = await settled_status(client, pid)  # for its conflict/CAS counts
            return out
        except (TimeoutError, nats.errors.Error) as exc:
            # the placement may still have happened: follow the pipeline like any other
            out.reason = f"submit got no reply: {type(exc).__name__}"
        if pid in cancel:
            out.cancel = await cancel_it(pid)
        try:
            await ended(pid, fut)
            out.done_s = time.perf_counter() - t0
        except TimeoutError:
            terminals.forget(pid)
            out.reason = out.reason or f"{NOT_TERMINAL} {TERMINAL_TIMEOUT_S:.0f} s after submit"
        st = await settled_status(client, pid)
        out.status = st
        if st is not None:
            out.state = st.state
            if st.state != "succeeded":
                out.reason = st.reason or out.reason or "(no reason given)"
        elif not out.reason:
            out.reason = UNSETTLED
        if out.cancel and out.status is not None and out.cancel != out.state:
            # answered cancelled, it must end cancelled; answered ended, as it was answered
            out.reason = f"its cancel was answered {out.cancel}, and it ended {out.state}"
        return out

    async def cancel_it(pid: str) -> str:
        """Cancel a pipeline just placed, through whichever replica the queue group picks;
        with `resubmit`, asked again while unanswered or unavailable (a failure injected)."""
        attempt = 0
        while True:
            try:
                return (await client.cancel(pid, reason="booking stress")).state
            except RemoteError as exc:
                why = f"refused {exc.code}: {exc.envelope.message[:200]}"
                again = resubmit and exc.code == "unavailable"
            except (TimeoutError, nats.errors.Error) as exc:
                why, again = f"refused {type(exc).__name__}", resubmit
            if not again or attempt == MAX_RESUBMITS:
                return why
            attempt += 1
            await asyncio.sleep(RESUBMIT_PAUSE_S)  # a client's back-off, not a wait on state

    async def submit(pid: str, spec: PipelineSpec, out: Outcome) -> SubmitReply:
        """The submit; with `resubmit`, sent again under the same id (never placed twice) while
        unanswered (its replica died with it), while the id is held by a replica placing it
        (a dead one's claim lapses in seconds; adopted, or given up and placed anew), or while
        the service is unavailable (no agent up: the fleet restarting)."""
        while True:
            try:
                return await client.submit(spec, pipeline_id=pid)
            except RemoteError as exc:
                placing = exc.code == "conflict" and "is being placed by" in exc.envelope.message
                later = placing or exc.code == "unavailable"  # e.g. no agent up: ask again
                if not (resubmit and later and out.resubmits < MAX_RESUBMITS):
                    raise
                await asyncio.sleep(RESUBMIT_PAUSE_S)  # a client's back-off, not a wait on state
            except (TimeoutError, nats.errors.Error):
                if not (resubmit and out.resubmits < MAX_RESUBMITS):
                    raise
            out.resubmits += 1

    async def ended(pid: str, fut: asyncio.Future[PipelineEvent]) -> None:
        """Its terminal event; with `resubmit`, also its status asked every STATUS_POLL_S
        without one (an event published while the server restarted is not kept)."""
        if not resubmit:
            await asyncio.wait_for(fut, TERMINAL_TIMEOUT_S)
            return
        async with asyncio.timeout(TERMINAL_TIMEOUT_S):
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), STATUS_POLL_S)
                    return
                with contextlib.suppress(Exception):
                    if (await client.status(pid)).state in TERMINAL_STATES:
                        return

    async def worker() -> None:
        for pid, spec in todo:
            done(await one(pid, spec))

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await terminals.stop()
    return LoadResult(outcomes, time.perf_counter() - t_start)


# -- the audit mirror ---------------------------------------------------------------------------
async def prepare_audit(url: str) -> None:
    """Create the bookings bucket and a full-history mirror of it, and prove the mirror live."""
    nc = await nats.connect(url, name="mars-bench-audit")
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=BUCKET, history=BOOKINGS_HISTORY))
        await js.add_stream(
            StreamConfig(
                name=MIRROR_STREAM,
                mirror=StreamSource(name=ORIGIN_STREAM),
                max_msgs_per_subject=-1,
                max_msgs=-1,
                max_bytes=-1,
                max_age=0,
            )
        )
        # the mirror's consumer starts asynchronously: wait until a sentinel write shows up
        arrived = asyncio.Event()

        async def seen(msg: Msg) -> None:
            if msg.subject == KV_PREFIX + SENTINEL_KEY:
                arrived.set()

        sub = await js.subscribe(
            KV_PREFIX + ">", stream=MIRROR_STREAM, ordered_consumer=True, cb=seen
        )
        try:
            await kv.put(SENTINEL_KEY, encode(DeviceBookings(device=SENTINEL_KEY)))
            async with asyncio.timeout(READY_TIMEOUT_S):
                await arrived.wait()
        finally:
            await sub.unsubscribe()
        await kv.delete(SENTINEL_KEY)
    finally:
        await nc.drain()


@dataclass
class Audit:
    messages: int = 0
    revisions: int = 0
    markers: int = 0
    keys: int = 0
    windows: int = 0
    max_windows: int = 0
    first_seq: int = 0
    last_seq: int = 0
    origin_last_seq: int = 0
    missing: int = 0
    revision_mismatches: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)
    wall_s: float = 0.0


async def audit_mirror(url: str) -> Audit:
    """Read every mirrored revision in order and check the booking invariants per key."""
    t0 = time.perf_counter()
    out = Audit()
    nc = await nats.connect(url, name="mars-bench-audit")
    try:
        js = nc.jetstream()
        origin = await js.stream_info(ORIGIN_STREAM)
        out.origin_last_seq = origin.state.last_seq
        last_rev: dict[str, int] = {}
        prev_seq = 0
        sub = await js.subscribe(KV_PREFIX + ">", stream=MIRROR_STREAM, ordered_consumer=True)
        try:
            while prev_seq < out.origin_last_seq:
                try:
                    msg = await sub.next_msg(timeout=30)
                except (TimeoutError, nats.errors.TimeoutError):
                    out.missing += out.origin_last_seq - prev_seq
                    break
                md = msg.metadata
                # A mirror stores each message under its source sequence: the KV revision.
                rev = md.sequence.stream
                key = msg.subject.removeprefix(KV_PREFIX)
                out.messages += 1
                if out.first_seq == 0:
                    out.first_seq = rev
                    out.missing += rev - 1
                elif rev > prev_seq + 1:
                    out.missing += rev - prev_seq - 1
                prev_seq = max(prev_seq, rev)
                before = last_rev.get(key)
                if before is not None and rev <= before:
                    out.violations.append(f"{key}: revision {rev} after {before}")
                last_rev[key] = rev
                op = (msg.headers or {}).get("KV-Operation")
                if op in ("DEL", "PURGE"):
                    out.markers += 1
                    continue
                try:
                    value = decode(msg.data, DeviceBookings)
                except DecodeError as exc:
                    out.undecodable.append(f"{key} rev {rev}: {exc.message}")
                    continue
                out.revisions += 1
                out.windows += len(value.windows)
                out.max_windows = max(out.max_windows, len(value.windows))
                ts = md.timestamp.timestamp()
                for pair in double_booked(value.windows, now=ts):
                    out.violations.append(f"{key} rev {rev} (written at {ts:.6f}): {pair}")
        finally:
            await sub.unsubscribe()
        out.last_seq = prev_seq
        out.keys = len(last_rev)
        # cross-check the revision field against the live bucket's own revisions
        kv = await js.key_value(BUCKET)
        with contextlib.suppress(NoKeysError):
            for key in await kv.keys():
                entry = await kv.get(key)
                if last_rev.get(key) != entry.revision:
                    out.revision_mismatches.append(
                        f"{key}: bucket at {entry.revision}, mirror last saw {last_rev.get(key)}"
                    )
    finally:
        await nc.drain()
    out.wall_s = time.perf_counter() - t0
    return out


# -- main ---------------------------------------------------------------------------------------
#: A pipeline that took longer than this from submit to end has its placement log printed.
SLOW_S = 2.0
#: `--priorities mixed`: (priority, preemptible) classes, one drawn per pipeline.
PRIORITY_CLASSES = ((10, True), (100, False), (500, False))


def make_specs(
    n: int, seed: int, priorities: str = "same", task_ms: tuple[float, float] = (1.0, 5.0)
) -> list[tuple[str, PipelineSpec]]:
    rng = random.Random(seed)
    classes = random.Random(f"{seed}-priorities")  # the same DAGs either way
    secs = (task_ms[0] / 1e3, task_ms[1] / 1e3)
    out = []
    for i in range(n):
        spec = synthetic_pipeline(rng, f"stress-{i}", tasks=(1, 4), seconds=secs)
        if priorities == "mixed":
            prio, pre = classes.choice(PRIORITY_CLASSES)
            spec = spec.model_copy(update={"priority": prio, "preemptible": pre})
        out.append((f"bs{seed}-{i:06d}", spec))
    return out


HELD = re.compile(r"^(\S+) started: its window on (\S+) is no longer preemptible$")
EVICTED = re.compile(r"^evicted from (\S+): (.+?) \(")
#: Placement-log words saying tasks were placed again (re-runs, re-placements, moves), and
#: the ids `synthetic_pipeline` gives tasks: a line with both forgets what it names.
PLACED_AGAIN = ("re-placed", "re-running", "booked again", "moved")
TASK_ID = re.compile(r"\bt\d+\b")
NOT_TAKEN = re.compile(r" still booked on | were stale")


def taken(log: Sequence[str], i: int, named: str) -> list[str]:
    """Of the tasks `named` by the eviction notice at `log[i]`, those whose window it took: a
    notice names tasks, not windows, and one that found its window still on the key (`still
    booked`), or not placed there (`stale`), was about another one."""
    answer = next((x for x in log[i + 1 :] if not x.startswith("round ")), "")
    kept = set(TASK_ID.findall(answer)) if NOT_TAKEN.search(answer) else set()
    return [t for t in named.split(", ") if t not in kept]


def held_then_evicted(statuses: Iterable[StatusReply | None]) -> list[StatusReply]:
    """Pipelines with an eviction notice naming a window their owner had made firm before
    (a started task's, which stays where it runs), once per such window: none may come, as
    a firm window cannot be taken. Read from each pipeline's placement log, in its order."""
    bad: list[StatusReply] = []
    for st in statuses:
        if st is None:
            continue
        log = st.placement_log
        held: set[tuple[str, str]] = set()
        for i, line in enumerate(log):
            if m := HELD.match(line):
                held.add((m[1], m[2]))
            elif m := EVICTED.match(line):
                bad += [st for t in taken(log, i, m[2]) if (t, m[1]) in held]
            elif any(w in line for w in PLACED_AGAIN):  # their next windows are new ones
                named = set(TASK_ID.findall(line))
                held = {h for h in held if h[0] not in named}
    return bad


def evictions_per_task(statuses: Iterable[StatusReply | None]) -> Counter[tuple[str, str]]:
    """Per (pipeline, task), how many eviction notices took its window (those whose owner
    found the window still booked, or the task placed elsewhere, took nothing)."""
    count: Counter[tuple[str, str]] = Counter()
    for st in statuses:
        if st is None:
            continue
        log = st.placement_log
        for i, line in enumerate(log):
            if m := EVICTED.match(line):
                count.update((st.pipeline_id, t) for t in taken(log, i, m[2]))
    return count


def timeline(st: StatusReply) -> str:
    """When its owner saw each task start and end (seconds after the commit): a pipeline
    that ended late shows where; one heard of late (its end event lost, its status asked
    every few seconds) ended well before the client's count."""

    def span(t: TaskStatus) -> str:
        if t.started_s is None:
            return f"not started ({t.state})"
        end = "running" if t.finished_s is None else f"{t.finished_s:.2f}"
        return f"{t.started_s:.2f}-{end}"

    tasks = "; ".join(f"{t.task_id}@{t.agent_id} {span(t)}" for t in st.tasks)
    return f"  its owner's account: {st.elapsed_s:.2f} s elapsed; tasks (start-end, s): {tasks}"


def logged(statuses: Iterable[StatusReply | None], match: Callable[[str], bool]) -> int:
    """Lines of these pipelines' placement logs that `match` (what their owners noted)."""
    return sum(1 for st in statuses if st is not None for x in st.placement_log if match(x))


async def drive(
    url: str, args: argparse.Namespace, services: Services, srv: EmbeddedNats | None = None
) -> LoadResult:
    for i in range(args.orchestrators):
        services.spawn(f"orchestrator-{i}", ["orchestrator", "--nats", url])
    # journals and outputs beside the logs: a restarted fleet replays what it journaled, and
    # a killed one leaves nothing behind in /tmp
    state = str(services.logdir / "agent-state")
    fleet = ["sim", "agents", "--nats", url, "--count", str(args.agents), "--prefix", "bs"]
    services.spawn("sim-agents", [*fleet, "--state-dir", state])
    kill = args.kill_after > 0
    injected = injects_failure(args)
    # a request lost to the failure (its replica dead, the server restarting) is sent again
    # after a few seconds, not waited on for half a minute
    # and the client outlasts a server restart of any length (by default it gives up after
    # three attempts to reconnect: about 6 s)
    client = await Client.connect(
        url, timeout=KILL_SUBMIT_TIMEOUT_S if injected else 30.0, reconnects=-1
    )
    faults: dict[str, asyncio.Task[float]] = {}
    try:
        await wait_ready(client, services, args.orchestrators, args.agents)
        specs = make_specs(args.submissions, args.seed, args.priorities, args.task_ms)
        progress(
            f"submitting {len(specs)} pipelines ({sum(len(s.tasks) for _, s in specs)} tasks), "
            f"{args.concurrency} in flight"
        )
        cpu0 = services.cpu_seconds()
        # every failure asked for, each at its own time (they may overlap)
        if args.restart_server_after > 0 and srv is not None:
            faults[FAULT_SERVER] = asyncio.create_task(
                restart_server_later(srv, args.restart_server_after, args.server_down)
            )
        if kill:
            faults[FAULT_KILL] = asyncio.create_task(kill_later(services, args.kill_after))
        if args.restart_agents_after > 0:
            faults[FAULT_AGENTS] = asyncio.create_task(
                kill_later(services, args.restart_agents_after, restart="sim-agents")
            )
        every = args.cancel_every
        cancel = {pid for i, (pid, _) in enumerate(specs) if every and i % every == every - 1}
        result = await run_load(client, specs, args.concurrency, resubmit=injected, cancel=cancel)
        cpu1 = services.cpu_seconds()
        result.cpu_s = {k: cpu1[k] - cpu0[k] for k in cpu1 if k in cpu0}
        result.faults = await faults_done(faults)
        services.check()
        progress("every pipeline ended; waiting for no booked window to be live")
        result.unbooked_s, result.left_live = await wait_unbooked(client, UNBOOKED_WITHIN_S)
        services.check()
        for o in result.outcomes:  # what a status that never settled came to
            if o.status is None and o.reason.startswith(NOT_TERMINAL):
                o.later, o.later_status = await status_later(client, o.pipeline_id)
            if o.status is None and o.reason.startswith(UNSETTLED):
                o.later, st = await status_later(client, o.pipeline_id)
                if injected and st is not None and st.state in TERMINAL_STATES:
                    # recovering from the failure, its replicas answered late: counted (a row
                    # of its own), not failed; without an injected failure it fails the run
                    result.settled_late += 1
                    o.status, o.state = st, st.state
                    o.reason = "" if st.state == "succeeded" else st.reason or o.later
        return result
    finally:
        await faults_done(faults)  # none left to strike after the load (or its failure)
        await client.close()


async def status_later(client: Client, pid: str) -> tuple[str, StatusReply | None]:
    """A pipeline's status, and in one line its state, owner and last placement-log line."""
    try:
        st = await client.status(pid)
    except Exception as exc:
        return f"status asked after the load: {type(exc).__name__}: {exc}", None
    last = st.placement_log[-1][:200] if st.placement_log else "(no placement log)"
    return f"status asked after the load: {st.state}, owner {st.owner}; last: {last}", st


async def kill_later(services: Services, after_s: float, restart: str | None = None) -> float:
    """SIGKILL orchestrator-0 `after_s` into the load (`restart`: that child instead, started
    again at once); returns when it did."""
    t0 = time.perf_counter()
    await asyncio.sleep(after_s)  # the moment of the failure, chosen by the operator
    if restart is None:
        services.kill("orchestrator-0")
        progress(f"killed orchestrator-0 {time.perf_counter() - t0:.1f} s into the load")
    else:
        services.restart(restart)
        progress(f"killed and restarted {restart} {time.perf_counter() - t0:.1f} s into the load")
    return time.perf_counter() - t0


async def restart_server_later(srv: EmbeddedNats, after_s: float, down_s: float = 0.0) -> float:
    """Stop the nats-server `after_s` into the load and start it again `down_s` later on the
    same port and store (every connection drops and comes back; JetStream keeps its streams
    on disk). Once stopped it is started again even if this is cancelled meanwhile."""
    t0 = time.perf_counter()
    await asyncio.sleep(after_s)  # the moment of the failure, chosen by the operator
    stopping = asyncio.create_task(asyncio.to_thread(srv.stop))
    try:
        await asyncio.shield(stopping)
        await asyncio.sleep(down_s)  # the outage's length, chosen by the operator
    finally:
        await stopping  # a stop begun has ended before the start
        (Path(srv.store_dir) / "nats-server.log").unlink(missing_ok=True)  # "ready" is read there
        await asyncio.to_thread(srv.start)
    progress(f"restarted the nats-server {time.perf_counter() - t0:.1f} s into the load")
    return time.perf_counter() - t0


async def faults_done(faults: dict[str, asyncio.Task[float]]) -> dict[str, float]:
    """When each injected failure happened (seconds into the load); one not yet due is called
    off (a server already stopped is started again first) and left out."""
    for t in faults.values():
        t.cancel()  # no-op on one that is done
    await asyncio.gather(*faults.values(), return_exceptions=True)
    return {k: t.result() for k, t in faults.items() if not t.cancelled()}


async def wait_unbooked(client: Client, within_s: float) -> tuple[float, list[str]]:
    """Every pipeline has ended: each window is given back by its owner, or, its owner dead
    and the pipeline not adopted, expires with its lease. Seconds until the bucket holds no
    live window, and those still live after `within_s` (a lease renewed for a pipeline that
    has ended: a leak)."""
    t0 = time.perf_counter()
    js = client.nc.jetstream()
    while True:
        now = time.time()  # the booking clock is the wall clock
        live = [
            f"{k.key}: {w.pipeline_id}/{w.task_id} (expires in {w.expires - now:.1f} s)"
            for k in await read_bookings(js) for w in k.windows if w.expires > now
        ]  # fmt: skip
        waited = time.perf_counter() - t0
        if not live:
            return waited, []
        if waited > within_s:
            return math.nan, live
        await asyncio.sleep(0.25)  # polling the bucket: its values change by writes and by time


def cpu_rows(load: LoadResult) -> list[list[object]]:
    return [
        [f"CPU {k} (s, % of one core)", f"{v:.1f} ({100 * v / load.wall_s:.0f}%)"]
        for k, v in sorted(load.cpu_s.items())
    ]


def injects_failure(args: argparse.Namespace) -> bool:
    return bool(
        args.kill_after > 0 or args.restart_agents_after > 0 or args.restart_server_after > 0
    )


def kill_rows(
    args: argparse.Namespace, load: LoadResult, statuses: list[StatusReply]
) -> list[list[object]]:
    """With `--kill-after`: when the replica died, the pipelines another adopted, and the
    submits the client sent again."""
    if args.kill_after <= 0:
        return []
    return [
        when_row("orchestrator-0 SIGKILLed", load.faults.get(FAULT_KILL)),
        ["pipelines adopted by another replica", logged(statuses, lambda x: "adopted by" in x)],
        [
            "  of those, answered but never recorded (placed anew)",
            logged(statuses, lambda x: x.endswith("with no record: placed anew")),
        ],
        [
            "  of those, recorded only while being placed (placed anew)",
            logged(statuses, lambda x: x.endswith("before its placement committed: placed anew")),
        ],
    ]


def restart_rows(
    args: argparse.Namespace, load: LoadResult, statuses: list[StatusReply]
) -> list[list[object]]:
    """With `--restart-agents-after`: when the fleet went, and what recovery noted."""
    if args.restart_agents_after <= 0:
        return []
    return [
        when_row("agents' process SIGKILLed and restarted", load.faults.get(FAULT_AGENTS)),
        ["pipelines told of a suspected partition", logged(statuses, lambda x: "partition" in x)],
        [
            "recovery re-placements (log lines)",
            logged(statuses, lambda x: ": re-placed " in x or "(outputs lost)" in x),
        ],
        ["recoveries that could not place at once", logged(statuses, lambda x: "cannot re" in x)],
    ]


def server_rows(args: argparse.Namespace, load: LoadResult) -> list[list[object]]:
    if args.restart_server_after <= 0:
        return []
    return [when_row("nats-server restarted", load.faults.get(FAULT_SERVER))]


def cancelled_as_asked(o: Outcome) -> bool:
    """Its cancel (`--cancel-every`) was answered with a state, and it ended in that state:
    cancelled, or succeeded when it had ended before the cancel came."""
    return bool(o.cancel) and o.cancel == o.state and o.state in ("cancelled", "succeeded")


def cancel_rows(args: argparse.Namespace, outs: list[Outcome]) -> list[list[object]]:
    """With `--cancel-every`: what the cancels were answered, and whether the pipelines
    ended as answered."""
    if args.cancel_every <= 0:
        return []
    asked = [o for o in outs if o.cancel]
    answers = Counter(o.cancel.split(":")[0] for o in asked)
    return [
        [
            f"cancels sent (every {args.cancel_every}th pipeline, any replica)",
            f"{len(asked)}: " + ", ".join(f"{k} {n}" for k, n in answers.most_common()),
        ],
        [
            "  ended otherwise than answered, or refused (must be 0)",
            sum(1 for o in asked if not cancelled_as_asked(o)),
        ],
    ]


def when_row(what: str, at_s: float | None) -> list[object]:
    when = "never (the load ended first)" if at_s is None else f"{at_s:.1f}"
    return [f"{what} at (s into the load)", when]


def resubmit_row(load: LoadResult) -> list[object]:
    again = [o.resubmits for o in load.outcomes if o.resubmits]
    return ["submits sent again (pipelines / sends)", f"{len(again)} / {sum(again)}"]


def priority_rows(args: argparse.Namespace, outs: list[Outcome]) -> list[list[object]]:
    """With mixed priorities: per class, its pipelines, how many succeeded, and how many
    evictions their placement logs record."""
    if args.priorities != "mixed":
        return []
    rows: list[list[object]] = []
    for prio, pre in PRIORITY_CLASSES:
        mine = [o for o in outs if o.priority == prio]
        ok = sum(1 for o in mine if o.state == "succeeded")
        evicted = logged((o.status for o in mine), lambda x: x.startswith("evicted from "))
        kind = "preemptible" if pre else "not preemptible"
        rows.append(
            [f"priority {prio} ({kind}): succeeded / evictions", f"{ok} of {len(mine)} / {evicted}"]
        )
    return rows


def report(args: argparse.Namespace, load: LoadResult, audit: Audit, total_s: float) -> int:
    outs = load.outcomes
    states = Counter(o.state for o in outs)
    ok = states.get("succeeded", 0)
    # a pipeline cancelled (`--cancel-every`) must end as its cancel was answered
    failed = [o for o in outs if not cancelled_as_asked(o) and (o.state != "succeeded" or o.cancel)]
    reasons = Counter(normalise_reason(o.reason) for o in failed)
    statuses = [o.status for o in outs if o.status is not None]
    firm_lost = held_then_evicted(statuses)
    per_task = evictions_per_task(statuses)
    most = per_task.most_common(1)
    submit_ms = [o.submit_s * 1e3 for o in outs if o.submit_s == o.submit_s]
    done_ms = [o.done_s * 1e3 for o in outs if o.done_s == o.done_s]
    print(
        f"booking stress: {args.orchestrators} orchestrators, {args.agents} emulated agents, "
        f"concurrency {args.concurrency}, seed {args.seed}, priorities {args.priorities}, "
        f"tasks {args.task_ms[0]:g}-{args.task_ms[1]:g} ms"
    )
    rows: list[list[object]] = [
        ["submissions", len(outs)],
        ["tasks submitted", sum(o.tasks for o in outs)],
        ["succeeded", ok],
        ["failed (any non-success)", len(failed)],
        *[[f"  state {k}", v] for k, v in sorted(states.items()) if k != "succeeded"],
        ["load wall time (s)", load.wall_s],
        ["submissions/s", len(outs) / load.wall_s if load.wall_s else float("nan")],
        ["submit latency P50 / P99 (ms)", f"{pct(submit_ms, 50):.1f} / {pct(submit_ms, 99):.1f}"],
        [
            "submit to end P50 / P99 / max (ms)",
            f"{pct(done_ms, 50):.1f} / {pct(done_ms, 99):.1f} / "
            f"{max(done_ms, default=math.nan):.0f}",
        ],
        ["sum conflicts", sum(s.conflicts for s in statuses)],
        ["sum rejections", sum(s.rejections for s in statuses)],
        ["sum cas_retries", sum(s.cas_retries for s in statuses)],
        [
            "eviction notices that moved nothing (stale: placed elsewhere, or still booked)",
            logged(statuses, lambda x: "were stale" in x or " still booked on " in x),
        ],
        [
            "tasks evicted / evicted more than twice / most times one task was",
            f"{len(per_task)} / {sum(1 for n in per_task.values() if n > 2)} / "
            + (f"{most[0][1]} ({most[0][0][0]}/{most[0][0][1]})" if most else "0"),
        ],
        [
            "re-placed tasks their agent had already run (kept as they were)",
            logged(statuses, lambda x: x.endswith("kept as it was") and "already ran" in x),
        ],
        [
            "started tasks' windows made non-preemptible",
            logged(statuses, lambda x: x.endswith("is no longer preemptible")),
        ],
        [
            "  of those, evicted after (must be 0)",
            len(firm_lost),
        ],
        [
            "re-placed tasks their agent was running (kept as they were)",
            logged(statuses, lambda x: x.endswith("kept as it was") and "is running" in x),
        ],
        [
            "ended producers whose place a re-placement's offer took (run again there)",
            logged(statuses, lambda x: x.endswith("it runs there again")),
        ],
        [
            "producers re-run for an input gone (lines naming a re-run)",
            logged(statuses, lambda x: "re-running" in x),
        ],
        [
            "windows found gone by an audit (no eviction notice heard)",
            logged(statuses, lambda x: x.startswith("windows gone")),
        ],
        [
            "tasks whose agent was asked about them (stalled, overdue, adopted, ...: log lines)",
            logged(statuses, lambda x: ", asked " in x and " about token " in x),
        ],
        ["pipelines with a status", len(statuses)],
        *kill_rows(args, load, statuses),
        *restart_rows(args, load, statuses),
        *server_rows(args, load),
        *([resubmit_row(load)] if injects_failure(args) else []),
        [
            "after the load: s until no booked window was live / windows still live (must be 0)",
            f"{load.unbooked_s:.2f} / {len(load.left_live)}",
        ],
        *priority_rows(args, outs),
        *cancel_rows(args, outs),
        [
            f"status settled only after the load (> {STATUS_SETTLE_S:.0f} s after its end)",
            str(load.settled_late),
        ],
        [
            "status stale right after terminal event",
            f"{SETTLE.stale} of {SETTLE.calls}"
            + (
                " (" + ", ".join(f"{k} {n}" for k, n in SETTLE.kinds.most_common()) + ")"
                if SETTLE.kinds
                else ""
            ),
        ],
        *cpu_rows(load),
        ["mirror messages read", audit.messages],
        ["revisions checked (values)", audit.revisions],
        ["delete/purge markers skipped", audit.markers],
        ["keys", audit.keys],
        ["windows checked (sum over revisions)", audit.windows],
        ["most windows in one revision", audit.max_windows],
        ["source sequences 1..N, N", audit.origin_last_seq],
        ["revisions missing from mirror", audit.missing],
        ["undecodable revisions", len(audit.undecodable)],
        ["mirror vs bucket revision mismatches", len(audit.revision_mismatches)],
        ["VIOLATIONS", len(audit.violations)],
        ["audit wall time (s)", audit.wall_s],
        ["total wall time (s)", total_s],
    ]
    print(table(rows, ["", "value"]))
    if reasons:
        print("\ntop failure reasons:")
        for reason, n in reasons.most_common(8):
            example = next(o for o in failed if normalise_reason(o.reason) == reason)
            print(f"  {n:6d}  {reason}")
            print(f"          e.g. {example.pipeline_id}: {example.reason[:300]}")
            if example.later:
                print(f"          {example.later}")
            st = example.status or example.later_status
            if st is not None and st.placement_log:
                # one that never ended: its whole recent account (the bug is in it)
                n = 6 if example.status is not None else 30
                if example.status is None:
                    tasks = ", ".join(f"{t.task_id} {t.state}@{t.agent_id}" for t in st.tasks)
                    print(f"          its tasks: {tasks}")
                print(f"          its placement log (last {n} lines):")
                for line in st.placement_log[-n:]:
                    print(f"            {line[:300]}")
    slowest = max((o for o in outs if o.done_s == o.done_s), key=lambda o: o.done_s, default=None)
    if slowest is not None and slowest.done_s > SLOW_S:
        # the slowest pipeline's own account of what held it (the tail is where bugs hide)
        print(
            f"\nslowest pipeline: {slowest.pipeline_id}, {slowest.done_s:.1f} s to its end "
            f"(its submit answered after {slowest.submit_s:.2f} s, "
            f"{slowest.resubmits} time(s) sent again)"
        )
        if slowest.status is not None:
            for line in slowest.status.placement_log[-40:]:
                print(f"  {line[:300]}")
            print(timeline(slowest.status))
    rerun = next((st for st in statuses if any("re-running" in x for x in st.placement_log)), None)
    if rerun is not None:  # a producer run twice: the first such pipeline's own account
        print(f"\na pipeline that re-ran a producer: {rerun.pipeline_id}")
        for line in rerun.placement_log[-40:]:
            print(f"  {line[:300]}")
    for title, items in (
        ("violations", audit.violations),
        ("undecodable", audit.undecodable),
        ("revision mismatches", audit.revision_mismatches),
    ):
        if items:
            print(f"\n{title} (first 20 of {len(items)}):")
            for line in items[:20]:
                print(f"  {line}")
    bad = audit.violations or audit.undecodable or audit.missing or audit.revision_mismatches
    print("\ninvariants: " + ("VIOLATED or incomplete audit" if bad else "hold on every revision"))
    if firm_lost:
        print(f"and {len(firm_lost)} evictions of windows made firm before, as in:")
        for line in firm_lost[0].placement_log[-40:]:
            print(f"  {line[:300]}")
    if load.left_live:
        print(f"\nwindows still live {UNBOOKED_WITHIN_S:.0f} s after every pipeline ended:")
        for line in load.left_live[:20]:
            print(f"  {line}")
    if failed:
        print(f"\n{len(failed)} pipelines did not succeed (every one must)")
    bad = bad or bool(firm_lost) or bool(load.left_live) or bool(failed)
    return 1 if bad else 0


def task_range(text: str) -> tuple[float, float]:
    """`LO,HI` milliseconds, 0 < LO <= HI."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"want LO,HI in ms, got {text!r}") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"want 0 < LO <= HI, got {text!r}")
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--orchestrators", type=int, default=2)
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--submissions", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--priorities",
        choices=["same", "mixed"],
        default="same",
        help="every pipeline at the default priority (default), or a third each low and "
        "preemptible, default, and high, so evictions happen while replicas book",
    )
    ap.add_argument(
        "--task-ms",
        type=task_range,
        default=(1.0, 5.0),
        metavar="LO,HI",
        help="each task sleeps a random time in this range, ms (default 1,5); tasks over the "
        "agents' 50 ms report their start, and a started task's window is made firm",
    )
    ap.add_argument(
        "--restart-server-after",
        type=float,
        default=0.0,
        metavar="S",
        help="stop the nats-server S seconds into the load and start it again, on the same "
        "port and store (0: never)",
    )
    ap.add_argument(
        "--server-down",
        type=float,
        default=0.0,
        metavar="S",
        help="with --restart-server-after: keep the server stopped S seconds (longer than the "
        "replicas' 3 s ownership leases: every lease lapses; default 0, started again at once)",
    )
    ap.add_argument(
        "--restart-agents-after",
        type=float,
        default=0.0,
        metavar="S",
        help="SIGKILL the emulated agents' process S seconds into the load and start it again "
        "at once (every agent back under a new incarnation; 0: never)",
    )
    ap.add_argument(
        "--kill-after",
        type=float,
        default=0.0,
        metavar="S",
        help="SIGKILL orchestrator-0 S seconds into the load (0: never); the client then "
        "sends unanswered submits again under the same id, as a client of a dead replica does",
    )
    ap.add_argument(
        "--cancel-every",
        type=int,
        default=0,
        metavar="N",
        help="cancel every Nth pipeline as soon as its submit is answered, through the API's "
        "queue group (any replica); it must end as the cancel was answered (0: none)",
    )
    args = ap.parse_args(argv)
    if args.server_down < 0 or (args.server_down > 0 and args.restart_server_after <= 0):
        ap.error("--server-down S needs S >= 0 and --restart-server-after")
    if args.kill_after > 0 and args.orchestrators < 2:
        ap.error("--kill-after needs --orchestrators 2 or more (one must survive)")
    if args.cancel_every < 0:
        ap.error("--cancel-every must be >= 0")
    if args.orchestrators < 1 or args.agents < 1 or args.submissions < 1 or args.concurrency < 1:
        ap.error("counts must be >= 1")
    t0 = time.perf_counter()
    # the server's store outlives a restart (`--restart-server-after`): one it made itself
    # would be deleted when it stops
    with (
        terminate_as_interrupt(),  # SIGTERM too stops every process and removes their files
        log_dir("mars-booking-stress-") as logs,
        tempfile.TemporaryDirectory(prefix="mars-booking-stress-nats-") as store,
        EmbeddedNats(store_dir=store) as srv,
    ):
        progress(f"nats-server on {srv.url}; creating {BUCKET} and its audit mirror")
        eventloop.run(prepare_audit(srv.url))
        with Services(logs) as services:
            load = eventloop.run(drive(srv.url, args, services, srv))
        progress("services stopped; auditing every mirrored revision")
        audit = eventloop.run(audit_mirror(srv.url))
    return report(args, load, audit, time.perf_counter() - t0)


if __name__ == "__main__":
    raise SystemExit(main())
