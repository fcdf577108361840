"""Booking stress: many small pipelines through several orchestrator replicas, then an audit
of every revision ever written to the reservation bucket, and of every task run's dataflow.

    python -m benchmarks.booking_stress [--orchestrators 2] [--agents 50]
        [--agent-processes 1] [--submissions 10000] [--concurrency 64] [--seed 1]
        [--priorities same|mixed] [--task-ms 1,5] [--kill-after S] [--cancel-every N]
        [--restart-agents-after S] [--restart-server-after S [--server-down S]]
        [--stop-agents-after S [--stop-for S]]

1. An embedded nats-server. Before anything books, the KV bucket MARS_BOOKINGS (history 8) is
   created here, with a JetStream *mirror* of its backing stream `KV_MARS_BOOKINGS` that has no
   per-subject limit, so every revision any orchestrator ever wrote is kept (the bucket itself
   keeps only the last 8 per key). A sentinel write proves the mirror is live before the
   orchestrators start.
2. `--orchestrators` `mars orchestrator` processes (one API queue group) and one
   `mars sim agents` process with `--agents` agents whose devices are emulated, or
   `--agent-processes N` of them sharing the agents, each with its own id prefix (`bsK-`),
   sites and state directory (their sites declare no link to each other's: WAN by default,
   so a plan keeps a pipeline within one process when it can).
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
   `--restart-server-after S` restart the fleet (every agents' process) or the broker
   instead. `--stop-agents-after S` SIGSTOPs one agents' process (`sim-agents-0`, with
   `--agent-processes` 2 or more) for `--stop-for` seconds (3): its agents fall silent with
   their connections open, are declared dead after 1.5 s, and their work is placed again
   while they still hold it; then they carry on with runs superseded meanwhile (tasks of
   `--task-ms 20,120` are caught mid-run). Keep its share of the fleet at most 30% (4
   processes: 26% of 50), or the partition rule holds the recovery until they return. The
   four may be given together, and each happens at its own time (one the load outlasts is
   reported as never having happened).
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
6. With the server still up, every task event is read from the MARS_EVENTS stream (each
   event id once: an end sent again is stored again) and every committed result from
   MARS_RESULTS, and each pipeline is judged (`judge_pipeline`). Per (task, token) a run ends
   (succeeded or failed) at most once; a run end of a task with deps names its input tokens.
   In a succeeded pipeline each committed consumer run (the event its result was committed
   from) must have run, for each dep P, on a run of P that succeeded and is not older than
   P's committed run (older: superseded by a re-placement; newer: P re-run because its
   output was lost, the first commit standing), and must not have started before that run
   could have ended: the consumer's start is its events' stream time less the run time
   they give, the producer run's earliest end its run time after the later of its
   booking's write (its token is that revision, whose time the mirror keeps) and the
   earliest ends of the runs it took its inputs from. Stream times lag the agents' moments
   by each event's wait in the agent's outbox, so a consumer dated before its producer's
   *end event* (by more than 20 ms) is only counted, with one such pipeline shown. A task
   that succeeded under two tokens is counted, and is a violation when nothing justifies a
   second run (no failure injected, `--priorities same`). Any violation, a result changed
   after its commit, an event the stream's limits dropped, or an undecodable one makes the
   exit status 1, and the first offending pipelines are printed with their events and the
   revisions of their results. A run that fails keeps its processes' logs, and says where.
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
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
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
from orchestrator.infra import eventloop
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.infra.procs import spawn, stop_all, terminate_as_interrupt
from orchestrator.reliability.health import DEFAULT_FLOOD_FRACTION
from orchestrator.reservations.book import double_booked
from orchestrator.reservations.listing import read_bookings
from orchestrator.reservations.store import BUCKET
from orchestrator.service import LEASE_S
from schemas import subjects
from schemas.api import (
    TASK_ENDED_STATES,
    TERMINAL_STATES,
    StatusReply,
    SubmitReply,
    TaskStatus,
)
from schemas.bookings import DeviceBookings
from schemas.codec import DecodeError, RemoteError, decode, encode
from schemas.events import PipelineEvent, TaskEvent
from schemas.pipeline import PipelineSpec
from schemas.recovery import ClusterEvent, TaskResult, TaskResults
from sim.fleet import synthetic_pipeline
from transport.client import Client

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
#: The failures `--restart-server-after`, `--kill-after`, `--restart-agents-after` and
#: `--stop-agents-after` inject; given together, each happens at its own time.
FAULT_SERVER, FAULT_KILL, FAULT_AGENTS, FAULT_STOP = "server", "kill", "agents", "stop"
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
        #: Children stopped by `pause` and not resumed yet (resumed before they are stopped).
        self.paused: set[str] = set()

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
        self.paused.discard(name)
        self.cpu_before[name] = used
        args, env = self._args[name]
        fh = open(self.logdir / f"{name}.log", "ab")  # noqa: SIM115 (closed in stop())
        self._logs.append(fh)
        self.procs[i] = spawn(args, log=fh, env=env)

    def kill(self, name: str) -> None:
        """SIGKILL a child (a replica that dies without a word); `check` expects it gone."""
        self.procs[self.names.index(name)].kill()
        self.killed.add(name)

    def pause(self, name: str) -> None:
        """SIGSTOP a child (a host frozen: a VM paused, a long GC, a swap storm): its TCP
        connections stay open and it says nothing until `resume`."""
        self.procs[self.names.index(name)].send_signal(signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        """SIGCONT a child `pause` stopped: it carries on where it was, unaware of the gap."""
        proc = self.procs[self.names.index(name)]
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self.paused.discard(name)

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
        for name in list(self.paused):  # a stopped process would not hear SIGTERM
            self.resume(name)
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
    #: What was submitted (the dataflow audit judges each pipeline by its spec's deps).
    specs: list[tuple[str, PipelineSpec]] = field(default_factory=list)


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
    #: When each revision was written (server time): a booking's revision is its fencing
    #: token, and no run under a token starts before its booking was written.
    written: dict[int, float] = field(default_factory=dict)
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
                out.written[rev] = md.timestamp.timestamp()
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


# -- the dataflow audit -------------------------------------------------------------------------
#: A consumer may be dated this much before its producer run's end and still count as after
#: it: times are the server's (its wall clock), run times the agents' (a monotonic clock,
#: read just before the output is handed on), so the two are a few ms apart at most.
EARLY_SLACK_S = 0.020
#: The ends of a task's run: one per (task, token). `cancelled` is none: an agent asked about
#: a job it does not hold answers with a `cancelled` event, and a withdrawn job never ran.
RUN_ENDS = frozenset({"succeeded", "failed"})
#: The dataflow audit's kinds of violation (each must be 0): `Verdict` field, report row.
FLOW_KINDS = (
    ("superseded", "consumers that ran on a superseded producer run"),
    ("early", "consumers started before their producer's committed run could have ended"),
    ("twice", "task runs that ended more than once under one token"),
    ("untokened", "run end events of consumers without input tokens"),
    ("incomplete", "committed results missing, or their event not in MARS_EVENTS"),
    ("rewritten", "committed results changed after their commit"),
)
#: Consumers dated before their producer run's end by the events' stream times alone: each
#: time is the agent's moment plus the event's wait in the agent's outbox, which the
#: producer's end event may spend while a consumer on the same agent already runs (tens of
#: ms on a busy fleet process; seconds for an agent stopped or cut off just after a run).
#: Counted and shown, not a violation.
DATED_EARLY = "dated_early"
#: Tasks that succeeded under more than one token: a violation only when nothing justifies
#: a second run (no failure injected, no evictions).
RERUNS = "reruns"
#: Offending pipelines printed with their events, per kind (of those dated early: one).
SHOWN = 3
#: Reading a stream: how long to wait for one more message before deciding none is left.
READ_IDLE_S = 5.0


@dataclass(frozen=True)
class Stored:
    """A task event as MARS_EVENTS stored it: its stream sequence, and its timestamp there
    (the server's clock: one clock for every event)."""

    seq: int
    ts: float
    ev: TaskEvent


@dataclass
class Verdict:
    """One pipeline's dataflow judged: what each kind found, a line each."""

    #: Distinct task runs that ended ((task, token) with a succeeded or failed event).
    runs: int = 0
    #: Inputs of committed consumer runs judged (one per dep).
    inputs: int = 0
    #: The smallest gap between a consumer's start and its producer run's end, both dated
    #: by stream times (s; negative: dated before, see DATED_EARLY).
    closest_s: float = math.inf
    #: The smallest gap between a consumer's start (by stream times) and the earliest its
    #: producer run could have ended (s): how close the judged runs came to a violation.
    margin_s: float = math.inf
    #: Consumers more than the slack early when dated by end events alone (the start as the
    #: end event's time less the run time; no `started` event consulted).
    early_by_ends: int = 0
    #: Runs with a `started` and an end event: how far apart the two date its start (ms;
    #: the difference of the two events' publish lags).
    lag_spread_ms: list[float] = field(default_factory=list)
    #: Judged runs whose token is no booking revision the audit mirror holds.
    unbooked: int = 0
    #: Runs that succeeded under a token older than their task's committed run (superseded:
    #: the run a fault left behind, ended after it was placed again), and consumer runs
    #: (task, token) that ended (cancelled too) on an input from such a run (none may be
    #: committed): how often the failure injected made what the audit looks for.
    superseded_runs: int = 0
    fed_superseded: int = 0
    superseded: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    untokened: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    dated_early: list[str] = field(default_factory=list)
    reruns: list[str] = field(default_factory=list)


def first_copies(stored: Sequence[Stored]) -> tuple[list[Stored], int]:
    """Each event once (its first stored copy), in stream order, and how many copies were
    skipped: an agent asked about an ended job sends its end event again under the same id,
    which the stream stores again once its duplicate window has passed."""
    seen: set[str] = set()
    out: list[Stored] = []
    for s in sorted(stored, key=lambda s: s.seq):
        if s.ev.event_id not in seen:
            seen.add(s.ev.event_id)
            out.append(s)
    return out, len(stored) - len(out)


def committed_results(
    values: Iterable[TaskResults],
) -> tuple[dict[str, dict[str, TaskResult]], dict[str, list[str]]]:
    """From every revision of MARS_RESULTS in stream order: per pipeline, each task's
    committed result (as first written), and per pipeline the results a later revision
    changed (none may: each is added once and never changed)."""
    first: dict[str, dict[str, TaskResult]] = {}
    changed: dict[str, list[str]] = {}
    for value in values:
        mine = first.setdefault(value.pipeline_id, {})
        for r in value.results:
            was = mine.setdefault(r.task_id, r)
            if was != r:
                changed.setdefault(value.pipeline_id, []).append(
                    f"{r.task_id}: committed under token {was.token} (event {was.event_id}), "
                    f"later under {r.token} (event {r.event_id})"
                )
    return first, changed


def run_span(end: Stored, began: float | None) -> tuple[float, float]:
    """When a run started and ended by stream times, from its end event and (for a run long
    enough to report its start) its `started` event's time less the run time it gave
    (`began`). Each stream time is the agent's moment plus the event's publish lag, so each
    is an upper bound: the earlier of the two events' is kept (the less lagged)."""
    ran = end.ev.duration_s or 0.0
    start, stop = end.ts - ran, end.ts
    if began is not None:
        start, stop = min(start, began), min(stop, began + ran)
    return start, stop


def judge_pipeline(
    deps: Mapping[str, Sequence[str]],
    events: Iterable[Stored],
    committed: Mapping[str, TaskResult] | None,
    booked: Mapping[int, float] | None = None,
    slack_s: float = EARLY_SLACK_S,
) -> Verdict:
    """Judge a pipeline's task events (each once, in stream order) against its committed
    results (None: the pipeline did not succeed; only its runs are judged), `booked` giving
    when each booking revision (a fencing token) was written.

    Every run ends once per token, and a consumer's end says which producer run each input
    came from. A succeeded pipeline's committed consumer run must have run on, for each dep
    P, a run of P that succeeded and is not older than P's committed run (older: superseded
    by a re-placement; newer: a re-run of an output that was lost, which is the same
    output), and must not have started before that run could have ended. The consumer's
    start is dated by stream times (`run_span`: an upper bound); the producer run's
    earliest end is its run time after the later of its booking's write (its token) and
    the earliest ends of the runs it took its own inputs from: nothing in that bound lags,
    so a start before it is a violation, never publish lag. Dated against the producer's
    own events instead (`run_span`), a start before its end is only counted (DATED_EARLY)."""
    v = Verdict()
    booked = booked or {}
    by_id: dict[str, Stored] = {}
    ends: dict[tuple[str, int], list[Stored]] = {}
    succeeded: dict[str, dict[int, Stored]] = {}  # task -> token -> its first success
    began: dict[tuple[str, int], float] = {}  # (task, token) -> its start, by `started`
    for s in events:
        ev = s.ev
        by_id.setdefault(ev.event_id, s)
        if ev.state == "started":
            at = s.ts - (ev.duration_s or 0.0)
            began[ev.task_id, ev.token] = min(at, began.get((ev.task_id, ev.token), at))
        if ev.state not in RUN_ENDS:
            continue
        ends.setdefault((ev.task_id, ev.token), []).append(s)
        if ev.state == "succeeded":
            succeeded.setdefault(ev.task_id, {}).setdefault(ev.token, s)
        if deps.get(ev.task_id) and ev.input_tokens is None:
            v.untokened.append(
                f"{ev.task_id} {ev.state} under token {ev.token} on {ev.agent_id} "
                f"(event {ev.event_id}) says no input tokens"
            )
    v.runs = len(ends)
    for (task, token), got in sorted(ends.items()):
        if (task, token) in began:
            first = got[0]
            at = first.ts - (first.ev.duration_s or 0.0)
            v.lag_spread_ms.append((at - began[task, token]) * 1e3)
        if len(got) > 1:
            each = ", ".join(f"{s.ev.state} (event {s.ev.event_id}, {s.ev.agent_id})" for s in got)
            v.twice.append(f"{task} ended {len(got)} times under token {token}: {each}")
    for task, runs in sorted(succeeded.items()):
        if len(runs) > 1:
            v.reruns.append(f"{task} succeeded under tokens {', '.join(map(str, sorted(runs)))}")
    if committed is None:
        return v
    earliest: dict[tuple[str, int], float] = {}

    def earliest_end(task: str, token: int) -> float:
        """The earliest moment the run of `task` under `token` could have ended (-inf: no
        bound known)."""
        key = (task, token)
        if key not in earliest:
            earliest[key] = -math.inf  # while it is worked out (a DAG has no cycle anyway)
            run = succeeded.get(task, {}).get(token)
            if run is None:
                return -math.inf
            start = booked.get(token, -math.inf)
            if booked and token not in booked:
                v.unbooked += 1
            for d, t in sorted((run.ev.input_tokens or {}).items()):
                start = max(start, earliest_end(d, t))
            earliest[key] = start + (run.ev.duration_s or 0.0)
        return earliest[key]

    for task in deps:
        if task not in committed:
            v.incomplete.append(f"{task}: no committed result")
    for task, runs in succeeded.items():
        mark = committed.get(task)
        v.superseded_runs += sum(1 for t in runs if mark is not None and t < mark.token)
    fed = {
        (s.ev.task_id, s.ev.token)
        for s in by_id.values()
        if s.ev.state in TASK_ENDED_STATES
        for d, t in (s.ev.input_tokens or {}).items()
        if d in committed and t < committed[d].token
    }
    v.fed_superseded = len(fed)
    for task, needs in deps.items():
        r = committed.get(task)
        if not needs or r is None:
            continue
        mine = by_id.get(r.event_id)
        if mine is None or mine.ev.state != "succeeded" or mine.ev.token != r.token:
            v.incomplete.append(
                f"{task}: committed under token {r.token} from event {r.event_id}, "
                "which MARS_EVENTS does not hold as its success"
            )
            continue
        used_tokens = mine.ev.input_tokens
        if used_tokens is None:
            continue  # counted as untokened
        start, _ = run_span(mine, began.get((task, r.token)))
        for p in needs:
            v.inputs += 1
            theirs = committed.get(p)
            used = used_tokens.get(p)
            run = None if used is None else succeeded.get(p, {}).get(used)
            if theirs is None:
                continue  # counted as incomplete
            if used is None or run is None or used < theirs.token:
                why = (
                    "names no run of it" if used is None
                    else f"under token {used}, which never succeeded" if run is None
                    else f"under token {used}, older than its committed run's {theirs.token}"
                )  # fmt: skip
                v.superseded.append(f"{task} (token {r.token}) ran on {p} {why}")
            if used is None or run is None:
                continue
            could = earliest_end(p, used)
            v.margin_s = min(v.margin_s, start - could)
            if start < could - slack_s:
                v.early.append(
                    f"{task} (token {r.token}) started {(could - start) * 1e3:.1f} ms before "
                    f"{p}'s run under token {used} could have ended (booked, its inputs' "
                    "earliest ends, its run time)"
                )
            _, ended = run_span(run, began.get((p, used)))
            gap = start - ended
            v.closest_s = min(v.closest_s, gap)
            if gap < -slack_s:
                v.dated_early.append(
                    f"{task} (token {r.token}) dated {-gap * 1e3:.1f} ms before {p}'s run "
                    f"under token {used} ended (stream times, its end event seq {run.seq})"
                )
            if mine.ts - (mine.ev.duration_s or 0.0) - run.ts < -slack_s:
                v.early_by_ends += 1
    return v


@dataclass
class Dataflow:
    """The dataflow audit of every pipeline: what was read, and each kind's offences as
    (pipeline, line)."""

    events: int = 0
    copies: int = 0
    undecodable: int = 0
    results: int = 0
    #: MARS_EVENTS as the audit found it, and what its limits had dropped by then.
    stream_messages: int = 0
    stream_bytes: int = 0
    stream_max_bytes: int = 0
    stream_max_age_s: float = 0.0
    dropped: int = 0
    pipelines: int = 0
    judged: int = 0
    runs: int = 0
    inputs: int = 0
    early_by_ends: int = 0
    unbooked: int = 0
    superseded_runs: int = 0
    fed_superseded: int = 0
    closest_s: float = math.inf
    margin_s: float = math.inf
    lag_spread_ms: list[float] = field(default_factory=list)
    #: Whether a task that succeeded under two tokens is a violation (nothing justifies it).
    strict_reruns: bool = False
    found: dict[str, list[tuple[str, str]]] = field(
        default_factory=lambda: {k: [] for k in (*(k for k, _ in FLOW_KINDS), DATED_EARLY, RERUNS)}
    )
    events_of: dict[str, list[Stored]] = field(default_factory=dict)
    committed_of: dict[str, dict[str, TaskResult]] = field(default_factory=dict)
    #: Per pipeline, every revision of its results chunks: (sequence, time, key, tasks).
    revisions_of: dict[str, list[tuple[int, float, str, list[str]]]] = field(default_factory=dict)
    #: What the replicas concluded about agents meanwhile (`cluster_summary`).
    cluster: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def add(self, pid: str, v: Verdict, judged: bool) -> None:
        self.pipelines += 1
        self.judged += judged
        self.runs += v.runs
        self.inputs += v.inputs
        self.early_by_ends += v.early_by_ends
        self.unbooked += v.unbooked
        self.superseded_runs += v.superseded_runs
        self.fed_superseded += v.fed_superseded
        self.closest_s = min(self.closest_s, v.closest_s)
        self.margin_s = min(self.margin_s, v.margin_s)
        self.lag_spread_ms += v.lag_spread_ms
        for kind in self.found:
            if kind != "rewritten":  # found across pipelines, from the results' revisions
                self.found[kind] += [(pid, line) for line in getattr(v, kind)]

    def violations(self) -> int:
        kinds = [k for k, _ in FLOW_KINDS] + ([RERUNS] if self.strict_reruns else [])
        return sum(len(self.found[k]) for k in kinds)

    def complete(self) -> bool:
        return not self.dropped and not self.undecodable


def cluster_summary(events: Iterable[ClusterEvent]) -> dict[str, int]:
    """Per kind of cluster event, the distinct agents it named (`agent_*`: each replica
    judges every agent, and says so) or how often it came (`partition_*`): whether an
    injected failure killed agents in the replicas' eyes, or was taken for a partition and
    its recovery held."""
    agents: dict[str, set[str]] = {}
    times: Counter[str] = Counter()
    for ev in events:
        times[ev.kind] += 1
        agents.setdefault(ev.kind, set()).update(ev.agents)
    return {k: n if k.startswith("partition") else len(agents[k]) for k, n in times.items()}


async def read_stream(js: Any, stream: str, subject: str) -> AsyncIterator[Msg]:
    """Every message of `stream` on `subject`, in order, through an ordered consumer; done
    at the one that says none is pending after it, at once when its consumer holds none (or
    after READ_IDLE_S of silence)."""
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    try:
        with contextlib.suppress(Exception):  # not known: the silence decides
            info = await sub.consumer_info()
            if info.num_pending + info.delivered.consumer_seq == 0:
                return  # no message matches
        while True:
            try:
                msg = await sub.next_msg(timeout=READ_IDLE_S)
            except (TimeoutError, nats.errors.TimeoutError):
                return
            yield msg
            if msg.metadata.num_pending == 0:
                return
    finally:
        await sub.unsubscribe()


async def audit_dataflow(
    url: str,
    specs: Sequence[tuple[str, PipelineSpec]],
    outs: Sequence[Outcome],
    booked: Mapping[int, float],
    strict: bool,
) -> Dataflow:
    """Read every task event from MARS_EVENTS and every committed result from MARS_RESULTS
    (the services stopped, the server still up), and judge each pipeline (`judge_pipeline`,
    `booked`: when each booking revision was written, from the audit mirror); `strict`: a
    task run under two tokens is a violation (nothing justified a second run)."""
    t0 = time.perf_counter()
    out = Dataflow(strict_reruns=strict)
    stored: dict[str, list[Stored]] = {}
    values: list[TaskResults] = []
    nc = await nats.connect(url, name="mars-bench-dataflow")
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.EVENTS_STREAM)
        st = info.state
        out.stream_messages, out.stream_bytes = st.messages, st.bytes
        out.stream_max_bytes = info.config.max_bytes or -1
        out.stream_max_age_s = float(info.config.max_age or 0)
        # limits drop the oldest first: the stream starts after them (interior deletes: none
        # but those the limits make)
        out.dropped = max(0, st.first_seq - 1) + (st.num_deleted or 0)
        async for msg in read_stream(js, subjects.EVENTS_STREAM, subjects.ALL_TASK_EVENTS):
            try:
                ev = decode(msg.data, TaskEvent)
            except DecodeError:
                out.undecodable += 1
                continue
            md = msg.metadata
            stored.setdefault(ev.pipeline_id, []).append(
                Stored(md.sequence.stream, md.timestamp.timestamp(), ev)
            )
            out.events += 1
        said: list[ClusterEvent] = []
        async for msg in read_stream(js, subjects.EVENTS_STREAM, subjects.CLUSTER_EVENTS):
            with contextlib.suppress(DecodeError):
                said.append(decode(msg.data, ClusterEvent))
        out.cluster = cluster_summary(said)
        bucket = subjects.RESULTS_BUCKET
        async for msg in read_stream(js, f"KV_{bucket}", f"$KV.{bucket}.>"):
            if not msg.data:  # a delete or purge marker
                continue
            try:
                value = decode(msg.data, TaskResults)
            except DecodeError:
                out.undecodable += 1
                continue
            values.append(value)
            md = msg.metadata
            key = msg.subject.removeprefix(f"$KV.{bucket}.")
            out.revisions_of.setdefault(value.pipeline_id, []).append(
                (
                    md.sequence.stream,
                    md.timestamp.timestamp(),
                    key,
                    [r.task_id for r in value.results],
                )
            )
    finally:
        await nc.drain()
    out.results = len(values)
    committed, changed = committed_results(values)
    out.found["rewritten"] = [(pid, line) for pid, lines in changed.items() for line in lines]
    state = {o.pipeline_id: o.state for o in outs}
    for pid, spec in specs:
        events, copies = first_copies(stored.get(pid, []))
        out.copies += copies
        ok = state.get(pid) == "succeeded"
        deps = {t.id: tuple(t.deps) for t in spec.tasks}
        v = judge_pipeline(deps, events, committed.get(pid, {}) if ok else None, booked)
        out.add(pid, v, ok)
        out.events_of[pid] = events
        out.committed_of[pid] = committed.get(pid, {})
    out.wall_s = time.perf_counter() - t0
    return out


def flow_rows(flow: Dataflow) -> list[list[object]]:
    """The dataflow audit's figures for the report table."""
    limit = "no limit" if flow.stream_max_bytes < 0 else f"{flow.stream_max_bytes / 2**20:.0f}"
    closest = "none judged" if flow.closest_s == math.inf else f"{flow.closest_s * 1e3:.1f}"
    bound = "none judged" if flow.margin_s == math.inf else f"{flow.margin_s * 1e3:.1f}"
    spread = [abs(x) for x in flow.lag_spread_ms]
    slack = f"{EARLY_SLACK_S * 1e3:.0f} ms"
    rerun_note = (
        "must be 0: no failure injected, no eviction"
        if flow.strict_reruns
        else "re-placed by the injected failures or evictions"
    )
    kinds = ("agent_suspect", "agent_dead", "agent_alive", "partition_suspected")
    return [
        [
            "cluster events: agents suspect / dead / alive again, partitions suspected",
            " / ".join(str(flow.cluster.get(k, 0)) for k in kinds),
        ],
        [
            "MARS_EVENTS: messages / MiB (limit MiB, max age h)",
            f"{flow.stream_messages} / {flow.stream_bytes / 2**20:.1f} "
            f"({limit}, {flow.stream_max_age_s / 3600:.0f})",
        ],
        ["  events its limits dropped before the audit read them (must be 0)", flow.dropped],
        [
            "task events read / copies of an event id skipped / undecodable (must be 0)",
            f"{flow.events} / {flow.copies} / {flow.undecodable}",
        ],
        ["committed results revisions read (MARS_RESULTS)", flow.results],
        [
            "pipelines audited / succeeded ones whose committed runs were judged",
            f"{flow.pipelines} / {flow.judged}",
        ],
        ["task runs ended (distinct task, token)", flow.runs],
        ["consumer inputs judged (deps of committed consumer runs)", flow.inputs],
        [
            "runs superseded by a re-placement that succeeded / consumer runs fed by one",
            f"{flow.superseded_runs} / {flow.fed_superseded}",
        ],
        *[[f"{label} (must be 0)", len(flow.found[k])] for k, label in FLOW_KINDS],
        [
            f"tasks that succeeded under more than one token ({rerun_note})",
            len(flow.found[RERUNS]),
        ],
        ["DATAFLOW VIOLATIONS", flow.violations()],
        ["  closest consumer start after its producer run could have ended (ms)", bound],
        [
            f"  consumers > {slack} before their producer run's end, by end events' times",
            flow.early_by_ends,
        ],
        [
            "    by the earlier of started and end events (publish lag; not violations)",
            len(flow.found[DATED_EARLY]),
        ],
        ["    closest consumer start after its producer run's end by those (ms)", closest],
        [
            "    a run's start by its started vs end event, |diff| P50 / P99 / max (ms)",
            f"{pct(spread, 50):.1f} / {pct(spread, 99):.1f} / {max(spread, default=math.nan):.1f}"
            f" ({len(spread)} runs)",
        ],
        ["  judged runs whose token is no booking revision in the mirror", flow.unbooked],
        ["dataflow audit wall time (s)", flow.wall_s],
    ]


def print_flow(flow: Dataflow) -> None:
    """The first offending pipelines of each kind, with what they did wrong, their committed
    results, every revision of their results written, and every task event of theirs; one
    of those only dated early, for the publish lag it shows."""
    kinds = [
        *((k, label, SHOWN) for k, label in FLOW_KINDS),
        (RERUNS, "tasks that succeeded under more than one token", SHOWN),
        (DATED_EARLY, "consumers dated early by stream times (publish lag, not a violation)", 1),
    ]
    for kind, label, shown in kinds:
        found = flow.found[kind]
        if not found:
            continue
        pids = list(dict.fromkeys(pid for pid, _ in found))
        print(f"\n{label}: {len(found)} in {len(pids)} pipelines; the first {shown}:")
        for pid in pids[:shown]:
            print(f"  {pid}:")
            for p, line in found:
                if p == pid:
                    print(f"    {line}")
            for task, r in sorted(flow.committed_of.get(pid, {}).items()):
                by = f"(event {r.event_id}) by {r.committed_by}"
                print(f"    committed: {task} token {r.token} {by}")
            for seq, ts, key, tasks in flow.revisions_of.get(pid, []):
                print(f"    results revision seq {seq} {clock(ts)} ({key}): {', '.join(tasks)}")
            for line in event_lines(flow.events_of.get(pid, [])):
                print(f"    {line}")


def clock(ts: float) -> str:
    """A wall-clock time of this host to the ms (the server's stream times are on it too)."""
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1e3) % 1000:03d}"


def event_lines(events: Sequence[Stored]) -> list[str]:
    """A pipeline's task events, one line each: stream sequence and time, what and where."""
    if not events:
        return ["(no task events in MARS_EVENTS)"]
    out = []
    for s in events:
        ev = s.ev
        dur = "" if ev.duration_s is None else f" ran {ev.duration_s * 1e3:.1f} ms"
        inputs = "" if ev.input_tokens is None else f" inputs {ev.input_tokens}"
        out.append(
            f"seq {s.seq} {clock(s.ts)}: {ev.task_id} {ev.state} token {ev.token} on "
            f"{ev.agent_id} ({ev.incarnation}){dur}{inputs} event {ev.event_id}"
        )
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
    fleet = fleet_processes(args.agents, args.agent_processes, url, services.logdir)
    for name, cmd in fleet:
        services.spawn(name, cmd)
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
            names = [name for name, _ in fleet]
            faults[FAULT_AGENTS] = asyncio.create_task(
                kill_later(services, args.restart_agents_after, restart=names)
            )
        if args.stop_agents_after > 0:
            faults[FAULT_STOP] = asyncio.create_task(
                stop_later(services, args.stop_agents_after, args.stop_for, fleet[0][0])
            )
        every = args.cancel_every
        cancel = {pid for i, (pid, _) in enumerate(specs) if every and i % every == every - 1}
        result = await run_load(client, specs, args.concurrency, resubmit=injected, cancel=cancel)
        result.specs = specs
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


async def kill_later(
    services: Services, after_s: float, restart: Sequence[str] | None = None
) -> float:
    """SIGKILL orchestrator-0 `after_s` into the load (`restart`: those children instead, each
    started again at once: the whole fleet); returns when it did."""
    t0 = time.perf_counter()
    await asyncio.sleep(after_s)  # the moment of the failure, chosen by the operator
    at = clock(time.time())
    if restart is None:
        services.kill("orchestrator-0")
        progress(f"killed orchestrator-0 {time.perf_counter() - t0:.1f} s into the load ({at})")
    else:
        for name in restart:
            services.restart(name)
        names = ", ".join(restart)
        took = time.perf_counter() - t0
        progress(f"killed and restarted {names} {took:.1f} s into the load ({at})")
    return time.perf_counter() - t0


async def stop_later(services: Services, after_s: float, for_s: float, name: str) -> float:
    """SIGSTOP the agents' process `name` `after_s` into the load and SIGCONT it `for_s`
    later (its agents fall silent, are declared dead and their work placed again; then they
    carry on with the runs they had, superseded meanwhile). Once stopped it is continued even
    if this is cancelled meanwhile. Returns when it was stopped."""
    t0 = time.perf_counter()
    await asyncio.sleep(after_s)  # the moment of the failure, chosen by the operator
    services.pause(name)
    at = time.perf_counter() - t0
    progress(f"SIGSTOPped {name} {at:.1f} s into the load ({clock(time.time())}), for {for_s:g} s")
    try:
        await asyncio.sleep(for_s)  # the freeze's length, chosen by the operator
    finally:
        services.resume(name)
        took = time.perf_counter() - t0
        progress(f"SIGCONTed {name} {took:.1f} s into the load ({clock(time.time())})")
    return at


def fleet_processes(
    agents: int, processes: int, url: str, logdir: Path
) -> list[tuple[str, list[str]]]:
    """The `mars sim agents` processes the fleet is split over, as (name, arguments): one
    (`sim-agents`, agent ids `bs-NNNN`) or `processes`, each with its own prefix (`bsK-NNNN`,
    sites `bsK-site-N`) and its own state directory, so one can be stopped alone. Journals and
    outputs go beside the logs: a restarted fleet replays what it journaled, and a killed one
    leaves nothing behind in /tmp."""
    if processes == 1:
        named = [("sim-agents", "bs", agents, "agent-state")]
    else:
        named = [
            (f"sim-agents-{k}", f"bs{k}", agents // processes + (k < agents % processes),
             f"agent-state-{k}")
            for k in range(processes)
        ]  # fmt: skip
    fleet = ["sim", "agents", "--nats", url]
    return [
        (name, [*fleet, "--count", str(n), "--prefix", prefix, "--state-dir", str(logdir / state)])
        for name, prefix, n, state in named
    ]


async def restart_server_later(srv: EmbeddedNats, after_s: float, down_s: float = 0.0) -> float:
    """Stop the nats-server `after_s` into the load and start it again `down_s` later on the
    same port and store (every connection drops and comes back; JetStream keeps its streams
    on disk). Once stopped it is started again even if this is cancelled meanwhile."""
    t0 = time.perf_counter()
    await asyncio.sleep(after_s)  # the moment of the failure, chosen by the operator
    stopped = clock(time.time())
    stopping = asyncio.create_task(asyncio.to_thread(srv.stop))
    try:
        await asyncio.shield(stopping)
        await asyncio.sleep(down_s)  # the outage's length, chosen by the operator
    finally:
        await stopping  # a stop begun has ended before the start
        (Path(srv.store_dir) / "nats-server.log").unlink(missing_ok=True)  # "ready" is read there
        await asyncio.to_thread(srv.start)
    progress(
        f"restarted the nats-server {time.perf_counter() - t0:.1f} s into the load (stopped "
        f"at {stopped}, up again at {clock(time.time())})"
    )
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
        args.kill_after > 0
        or args.restart_agents_after > 0
        or args.restart_server_after > 0
        or args.stop_agents_after > 0
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
    """With `--restart-agents-after` or `--stop-agents-after`: when the fleet (or one of its
    processes) went, and what recovery noted."""
    if args.restart_agents_after <= 0 and args.stop_agents_after <= 0:
        return []
    rows: list[list[object]] = []
    if args.restart_agents_after > 0:
        rows.append(
            when_row("agents' processes SIGKILLed and restarted", load.faults.get(FAULT_AGENTS))
        )
    if args.stop_agents_after > 0:
        share = stopped_share(args.agents, args.agent_processes)
        rows.append(
            when_row(
                f"sim-agents-0 ({share:.0%} of the agents) SIGSTOPped for {args.stop_for:g} s",
                load.faults.get(FAULT_STOP),
            )
        )
    return [
        *rows,
        ["pipelines told of a suspected partition", logged(statuses, lambda x: "partition" in x)],
        [
            "recovery re-placements (log lines)",
            logged(statuses, lambda x: ": re-placed " in x or "(outputs lost)" in x),
        ],
        ["recoveries that could not place at once", logged(statuses, lambda x: "cannot re" in x)],
    ]


def stopped_share(agents: int, processes: int) -> float:
    """The share of the fleet `--stop-agents-after` stops: sim-agents-0's agents (the
    largest share, `fleet_processes` giving the first processes one more)."""
    return (agents // processes + (agents % processes > 0)) / agents


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


def report(
    args: argparse.Namespace, load: LoadResult, audit: Audit, flow: Dataflow, total_s: float
) -> int:
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
        *flow_rows(flow),
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
    print_flow(flow)
    flow_bad = flow.violations() > 0 or not flow.complete()
    print("dataflow: " + ("VIOLATED or incomplete audit" if flow_bad else "hold on every run"))
    bad = bad or bool(firm_lost) or bool(load.left_live) or bool(failed) or flow_bad
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
        "--agent-processes",
        type=int,
        default=1,
        metavar="N",
        help="split --agents over N `mars sim agents` processes, each with its own id prefix, "
        "sites and state directory (default 1); processes' sites have no declared link to "
        "each other (WAN by default), so plans keep a pipeline within one when they can",
    )
    ap.add_argument(
        "--stop-agents-after",
        type=float,
        default=0.0,
        metavar="S",
        help="SIGSTOP one agents' process (sim-agents-0; needs --agent-processes 2 or more) S "
        "seconds into the load and SIGCONT it --stop-for seconds later: its agents are "
        "declared dead, their work placed again, and they carry on with superseded runs "
        "(0: never). Keep its share of the fleet under the partition rule's 30%%, or "
        "recovery is held (4 processes: one is 25%%)",
    )
    ap.add_argument(
        "--stop-for",
        type=float,
        default=3.0,
        metavar="S",
        help="with --stop-agents-after: how long the process stays stopped (default 3 s, "
        "longer than the 1.5 s heartbeat-based detection)",
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
    if not 1 <= args.agent_processes <= max(1, args.agents):
        ap.error("--agent-processes must be between 1 and --agents")
    if args.stop_agents_after > 0 and (args.agent_processes < 2 or args.stop_for <= 0):
        ap.error("--stop-agents-after needs --agent-processes 2 or more and --stop-for > 0")
    if args.stop_agents_after > 0 and (
        stopped_share(args.agents, args.agent_processes) > DEFAULT_FLOOD_FRACTION
    ):
        progress(
            f"note: sim-agents-0 holds more than {DEFAULT_FLOOD_FRACTION:.0%} of the agents: "
            "stopped, they look like a partition, and recovery is held until they return"
        )
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
        progress("auditing every task event in MARS_EVENTS against MARS_RESULTS")
        strict = not injects_failure(args) and args.priorities == "same"
        flow = eventloop.run(
            audit_dataflow(srv.url, load.specs, load.outcomes, audit.written, strict)
        )
        failed = report(args, load, audit, flow, time.perf_counter() - t0)
        if failed:  # the replicas' and agents' own account of what the report found
            keep_logs(logs, "the run failed its checks")
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
