"""The agent's state machine: admission, inputs, readiness, slots. Pure and synchronous.

The asyncio shell (`edge_agent.service`) feeds it offers, commits, data and completions and does
whatever I/O the returned values ask for; tests drive it directly.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from edge_agent.allowlist import Allowlist
from schemas.agent import DeviceSpec, TaskKind
from schemas.limits import MAX_OUTPUT_BYTES
from schemas.pipeline import MediaType, OnnxRun, SyntheticRun
from schemas.placement import (
    CancelCommand,
    CommitCommand,
    DataAck,
    DataTransfer,
    OfferReply,
    RejectCode,
    TaskOffer,
)

Key = tuple[str, str]  # (pipeline_id, task_id)
#: A job's place in its device's queue: its booked window's start (booking clock; inf when
#: its offer names none), its pipeline's priority (negated: higher first), its place in its
#: own pipeline's plan, pipeline, task.
Rank = tuple[float, int, int, str, str]
#: A job that may start, as queued for its device: (rank, seq, job, offer).
Queued = tuple[Rank, int, "Job", TaskOffer]
#: A job not ready yet whose window is booked, as noted for its device: (window start, seq,
#: job, offer).
Booked = tuple[float, int, "Job", TaskOffer]
#: A job still waiting for its inputs (or commit) holds its window this long after the
#: window's end: then its plan has slipped, and the tasks booked after it go ahead.
HOLD_AFTER_S = 1.0
#: Ready jobs looked at past one that must wait, for one that fits before the windows ahead.
BACKFILL_LOOK = 16
JobState = Literal["accepted", "running", "succeeded", "failed", "cancelled"]
MAX_JOBS = 10_000
REMEMBERED = 4_096
#: Inputs of jobs withdrawn by a re-plan, kept for the task's next placement here (at most).
ORPHANS_KEPT = 256
#: How a job left: it ran (to its end, good or bad), a re-plan withdrew it (its task is
#: placed again, here or elsewhere, and still needs its inputs), or it was cancelled.
Ending = Literal["ran", "withdrawn", "cancelled"]

#: A job's inputs as kept for its next placement: bytes, producer tokens, media types.
Inputs = tuple[dict[str, bytes], dict[str, int], dict[str, MediaType | None]]

K = TypeVar("K")
V = TypeVar("V")


def _put_bounded(d: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    """Set `key` as the newest entry of `d`, dropping the oldest past `limit`."""
    d[key] = value
    d.move_to_end(key)
    while len(d) > limit:
        d.popitem(last=False)


@dataclass
class Job:
    offer: TaskOffer
    committed: bool = False
    state: JobState = "accepted"
    inputs: dict[str, bytes] = field(default_factory=dict)
    #: The fencing token of the producer run each input came from (said on the job's end
    #: event: the orchestrator commits its result only on its producers' committed runs).
    input_tokens: dict[str, int] = field(default_factory=dict)
    #: What each input was made as, said by its producer's agent (None: not said): how it is
    #: decoded where its producer's spec declares no `output_type` (`InputRef.media_type`).
    input_types: dict[str, MediaType | None] = field(default_factory=dict)
    #: Monotonic time it was accepted or committed, whichever was later, and when its
    #: pipeline's status was last asked about it (`stale_candidates`).
    since: float = field(default_factory=time.monotonic)
    checked: float = 0.0
    #: Its `started` event went out (only tasks that run past `started_event_after_s`).
    start_reported: bool = False

    @property
    def key(self) -> Key:
        return (self.offer.pipeline_id, self.offer.task.id)

    @property
    def rank(self) -> Rank:
        o = self.offer
        start = o.window_start if o.window_start is not None else math.inf
        return (start, -o.priority, o.order, o.pipeline_id, o.task.id)

    @property
    def run_s(self) -> float:
        """Its booked window's length (0 without one)."""
        o = self.offer
        if o.window_start is None or o.window_end is None:
            return 0.0
        return max(0.0, o.window_end - o.window_start)

    def ready(self) -> bool:
        return (
            self.committed
            and self.state == "accepted"
            and all(i.task_id in self.inputs for i in self.offer.inputs)
        )


class AgentCore:
    def __init__(
        self,
        agent_id: str,
        incarnation: str,
        devices: list[DeviceSpec],
        allowed_kinds: list[TaskKind],
        model_problem: Callable[[OnnxRun], str | None] = lambda _run: None,
        *,
        allowlist: Allowlist | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.incarnation = incarnation
        self.devices = {d.device_id: d for d in devices}
        self.allowed_kinds = set(allowed_kinds)
        self.model_problem = model_problem
        self.allowlist = allowlist or Allowlist()
        self.jobs: dict[Key, Job] = {}
        self.running: dict[str, int] = {d: 0 for d in self.devices}
        # Per device, the jobs that became ready (committed, every input here), in plan order.
        # An entry goes stale when its job starts, ends, is dropped or is offered again, and is
        # skipped when met: no event looks at every queued job (with thousands queued, a scan
        # per input, commit and finished task made an agent's work grow as their square).
        self._ready: dict[str, list[Queued]] = {d: [] for d in self.devices}
        # Per device, jobs accepted with a booked window, by its start: the first of those not
        # ready yet hold their windows against ready jobs booked after them (`take_ready`).
        # Entries go stale as ready-queue entries do.
        self._booked: dict[str, list[Booked]] = {d: [] for d in self.devices}
        #: Booking clock minus this host's monotonic clock, from the last offer batch or
        #: commit that said when it was sent (None: not heard yet; no window is held then).
        self.clock_offset: float | None = None
        #: When (monotonic) a job held back by a booked window may go ahead anyway (that
        #: window's hold ends): `take_ready` should be called again then.
        self.recheck_at: float | None = None
        self._seq = itertools.count()
        self.draining = False
        self.healthy = True
        # jobs gone from `jobs`, with their token and how they went, so a duplicate offer
        # (or a late input) is recognised after the fact
        self._done: OrderedDict[Key, tuple[int, Ending]] = OrderedDict()
        # inputs of jobs a re-plan withdrew, with the producer token of each: the task is
        # usually offered here again at once (its next round), and their producers count them
        # delivered and may have let them go
        self._orphans: OrderedDict[Key, Inputs] = OrderedDict()
        # the end event of each job that ended here, as sent (token, subject, event id, data):
        # sent again when the orchestrator, having heard no end, asks about the job. Short
        # tasks too: a look at a commit races their end events (asked "unstarted" as the end
        # was on its way, a finished task was said gone and placed again)
        self._ends: OrderedDict[Key, tuple[int, str, str, bytes]] = OrderedDict()

    # -- admission -----------------------------------------------------------------------------
    def _reject(self, offer: TaskOffer, code: RejectCode, reason: str) -> OfferReply:
        return OfferReply(
            pipeline_id=offer.pipeline_id,
            task_id=offer.task.id,
            agent_id=self.agent_id,
            accepted=False,
            code=code,
            reason=reason,
        )

    def admit(self, offer: TaskOffer) -> OfferReply:
        key = (offer.pipeline_id, offer.task.id)
        if offer.agent_id != self.agent_id:
            return self._reject(offer, "bad_spec", f"offer for agent {offer.agent_id}")
        if offer.incarnation != self.incarnation:
            return self._reject(
                offer, "stale_incarnation", f"planned for incarnation {offer.incarnation}"
            )
        done = self._done.get(key)
        # a provisional offer withdrawn uncommitted (its placement failed part-way) does not
        # stand in the way of the next placement of that pipeline id, provisional too
        again = done == (0, "withdrawn") and offer.token == 0
        if done is not None and offer.token <= done[0] and not again:
            return self._reject(offer, "duplicate", "task already finished here")
        if offer.replaces and done == (offer.replaces, "ran"):
            return self._reject(
                offer, "already_ran", f"task already ran here under token {offer.replaces}"
            )
        existing = self.jobs.get(key)
        if existing is not None:
            if offer.token == existing.offer.token:
                if existing.state == "accepted":
                    # a retried offer, maybe with updated routing, or naming the producer runs
                    # its inputs must now come from (a producer placed again)
                    existing.offer = offer
                    self._fence(existing)
                    self._note_booked(existing)
                    self._queue_if_ready(existing)  # its queued entry names the old offer
                elif existing.offer.consumers != offer.consumers:
                    # running: only where its output goes may change (read when it ends)
                    existing.offer = existing.offer.model_copy(
                        update={"consumers": offer.consumers}
                    )
                return self._accept(offer)
            if offer.token < existing.offer.token:
                return self._reject(offer, "stale_token", "a newer placement holds this task")
            if existing.state == "running":
                if offer.replaces and offer.replaces == existing.offer.token:
                    # the placement being replaced has started here: it keeps the task (its
                    # owner had not heard of the start), as it would had the start been heard
                    why = f"task is running here under token {offer.replaces}"
                    return self._reject(offer, "already_running", why)
                return self._reject(offer, "duplicate", "task is already running here")
        if self.draining:
            return self._reject(offer, "draining", "agent is draining")
        if not self.healthy:
            return self._reject(offer, "unhealthy", "agent reports itself unhealthy")
        device = self.devices.get(offer.device_id)
        if device is None:
            return self._reject(offer, "unknown_device", f"no device {offer.device_id}")
        if offer.slot >= device.slots:
            return self._reject(offer, "bad_spec", f"slot {offer.slot} >= {device.slots} slots")
        run = offer.task.run
        if run.kind not in self.allowed_kinds:
            return self._reject(offer, "kind_not_allowed", f"task kind {run.kind} not allowed")
        not_allowed = self.allowlist.problem(run)
        if not_allowed is not None:
            return self._reject(offer, "not_allowlisted", not_allowed)
        need = offer.task.requires.min_memory_mb
        if need > device.memory_mb:
            return self._reject(
                offer, "no_memory", f"needs {need:.0f} MB, device has {device.memory_mb:.0f}"
            )
        if isinstance(run, SyntheticRun) and run.output_bytes > MAX_OUTPUT_BYTES:
            return self._reject(
                offer, "bad_spec", f"output of {run.output_bytes} B exceeds {MAX_OUTPUT_BYTES} B"
            )
        if isinstance(run, OnnxRun):
            problem = self.model_problem(run)
            if problem:
                return self._reject(offer, "missing_model", problem)
        if existing is None and len(self.jobs) >= MAX_JOBS:
            return self._reject(offer, "no_capacity", f"{MAX_JOBS} jobs queued")
        job = self.jobs[key] = Job(offer)
        self._note_booked(job)
        # Placed here again (a newer token, e.g. moved by adaptive re-planning onto this same
        # agent, or offered again after a re-plan withdrew it): inputs that already arrived
        # stay. Their producers were told they were delivered and may have let them go;
        # dropping them would leave the task waiting for data nobody holds any more.
        if existing is not None:
            had: Inputs | None = (existing.inputs, existing.input_tokens, existing.input_types)
        else:
            had = self._orphans.pop(key, None)
        if had is not None and had[0]:
            job.inputs, job.input_tokens, job.input_types = dict(had[0]), dict(had[1]), dict(had[2])
            self._fence(job)
        return self._accept(offer)

    @staticmethod
    def _fence(job: Job) -> None:
        """Keep only the inputs the job's offer still takes: from a producer it still has,
        made by the producer run it names (any run while it names none: token 0)."""
        want = {i.task_id: i.token for i in job.offer.inputs}
        for p in list(job.inputs):
            token = want.get(p)
            if token is None or (token and job.input_tokens.get(p) != token):
                del job.inputs[p]
                job.input_tokens.pop(p, None)
                job.input_types.pop(p, None)

    def _accept(self, offer: TaskOffer) -> OfferReply:
        return OfferReply(
            pipeline_id=offer.pipeline_id,
            task_id=offer.task.id,
            agent_id=self.agent_id,
            accepted=True,
        )

    # -- progress ------------------------------------------------------------------------------
    def commit(self, cmd: CommitCommand) -> int:
        """Commit the named jobs; returns how many were newly committed. A provisionally
        offered job (token 0) takes its token from the command and stays uncommitted without
        one; a job is never committed under a token other than its own."""
        n = 0
        tokens = cmd.token_of()
        for tid in cmd.task_ids:
            job = self.jobs.get((cmd.pipeline_id, tid))
            if job is None or job.committed:
                continue
            token = tokens.get(tid)
            if job.offer.token == 0:
                if not token:
                    continue  # provisional and no token yet: it must not run
                job.offer = job.offer.model_copy(update={"token": token})
            elif token is not None and token != job.offer.token:
                continue  # a commit for another placement of this task than the one held
            job.committed = True
            job.since = time.monotonic()
            self._queue_if_ready(job)
            n += 1
        return n

    def stale_candidates(self, before: float) -> list[Job]:
        """Jobs not started that have waited since `before` or longer, and were not asked
        about since then: committed ones whose inputs never came, and ones never committed."""
        return [
            j for j in self.jobs.values()
            if j.state == "accepted" and j.since <= before and j.checked <= before
        ]  # fmt: skip

    def deliver(self, msg: DataTransfer, data: bytes | None = None) -> DataAck:
        """Store an input (`data`: the payload fetched for an object-store transfer)."""
        job = self.jobs.get((msg.pipeline_id, msg.consumer))
        if job is None or job.state != "accepted":
            return DataAck(
                pipeline_id=msg.pipeline_id, consumer=msg.consumer, ok=False, reason="no such job"
            )
        inp = next((i for i in job.offer.inputs if i.task_id == msg.producer), None)
        if inp is None:
            return DataAck(
                pipeline_id=msg.pipeline_id,
                consumer=msg.consumer,
                ok=False,
                reason=f"{msg.producer} is not an input of {msg.consumer}",
            )
        if inp.token and msg.token != inp.token:
            # made by another run of the producer than the one this placement takes: one
            # since replaced (its agent came back after the producer was placed again), or
            # one this agent has not been told of yet (told before that run can start)
            return DataAck(
                pipeline_id=msg.pipeline_id,
                consumer=msg.consumer,
                ok=False,
                reason=f"output of {msg.producer} under token {msg.token}: this placement "
                f"of {msg.consumer} takes its run under token {inp.token}",
            )
        payload = msg.data if data is None else data
        if payload is None:
            return DataAck(
                pipeline_id=msg.pipeline_id,
                consumer=msg.consumer,
                ok=False,
                reason="object payload was not fetched",
            )
        complete = msg.producer in job.inputs  # a duplicate: queued already if ready
        job.inputs[msg.producer] = payload  # a duplicate delivery overwrites with equal bytes
        job.input_tokens[msg.producer] = msg.token
        job.input_types[msg.producer] = msg.media_type
        if not complete:
            self._queue_if_ready(job)
        return DataAck(pipeline_id=msg.pipeline_id, consumer=msg.consumer, ok=True)

    def set_clock(self, sent_at: float | None) -> None:
        """A message from an orchestrator said the booking clock when it was sent."""
        if sent_at is not None:
            self.clock_offset = sent_at - time.monotonic()

    def _note_booked(self, job: Job) -> None:
        o = job.offer
        if o.window_start is None or o.device_id not in self._booked:
            return
        heap = self._booked[o.device_id]
        heapq.heappush(heap, (o.window_start, next(self._seq), job, o))
        if len(heap) > 2 * len(self.jobs) + 64:  # mostly stale
            heap[:] = [b for b in heap if self._holding(b, -math.inf)]
            heapq.heapify(heap)

    def _holding(self, b: Booked, now: float) -> bool:
        """Whether a noted window still holds its place: its job is here under that offer, not
        started, not ready (a ready one is in the ready queue), its window not long over."""
        job, offer = b[2], b[3]
        return (
            job.offer is offer and self.jobs.get(job.key) is job and job.state == "accepted"
            and not job.ready()
            and (offer.window_end is None or now < offer.window_end + HOLD_AFTER_S)
        )  # fmt: skip

    def _queue_if_ready(self, job: Job) -> None:
        if not job.ready():
            return
        o = job.offer
        heap = self._ready[o.device_id]
        heapq.heappush(heap, (job.rank, next(self._seq), job, o))
        if len(heap) > 2 * len(self.jobs) + 64:  # mostly stale: keep only what may still start
            heap[:] = [q for q in heap if self._startable(q)]
            heapq.heapify(heap)

    def _startable(self, q: Queued) -> bool:
        job, offer = q[2], q[3]
        return job.offer is offer and self.jobs.get(job.key) is job and job.ready()

    def _held_back(self, dev: str, job: Job, now: float, free: int) -> float | None:
        """Whether starting `job` now would delay a window booked before its own on `dev`:
        one of a job not ready yet that begins before `job`, started now, would end, with no
        slot left for it. Returns when (booking clock) the first such hold ends, or None if
        `job` may start (backfilling: it ends before the windows ahead begin, or they have
        slots enough)."""
        heap = self._booked[dev]
        while heap and not self._holding(heap[0], now):
            heapq.heappop(heap)
        if not heap:
            return None
        start = job.offer.window_start if job.offer.window_start is not None else math.inf
        before = min(start, now + job.run_s)
        if heap[0][0] >= before:
            return None
        ahead = [
            b for b in heapq.nsmallest(free + 8, heap)
            if b[0] < before and b[2] is not job and self._holding(b, now)
        ]  # fmt: skip
        if len(ahead) < free:
            return None
        return min((b[3].window_end or now) + HOLD_AFTER_S for b in ahead)

    def take_ready(self) -> list[Job]:
        """Jobs that may start now, per device in the order of their booked windows (then
        priority, then plan order), bounded by free slots. A ready job whose start would
        delay a window booked before its own, of a job still waiting for its inputs, waits
        (`recheck_at` says until when at most); one behind it that fits before that window
        goes first."""
        started: list[Job] = []
        mono = time.monotonic()
        now = None if self.clock_offset is None else mono + self.clock_offset
        self.recheck_at = None
        for dev, heap in self._ready.items():
            free = self.devices[dev].slots - self.running[dev]
            waiting: list[Queued] = []
            while free > 0 and heap and len(waiting) <= BACKFILL_LOOK:
                q = heapq.heappop(heap)
                if not self._startable(q):
                    continue  # started, ended, dropped or offered again since it was queued
                job = q[2]
                if now is not None and job.offer.window_start is not None:
                    until = self._held_back(dev, job, now, free)
                    if until is not None:
                        waiting.append(q)
                        at = mono + (until - now)
                        self.recheck_at = min(self.recheck_at or at, at)
                        continue
                self.running[dev] += 1
                job.state = "running"
                started.append(job)
                free -= 1
            for q in waiting:
                heapq.heappush(heap, q)
        if len(started) > 1:
            started.sort(key=lambda j: j.rank)
        return started

    def finish(self, key: Key, ok: bool) -> Job | None:
        job = self.jobs.pop(key, None)
        if job is None:
            return None
        if job.state == "running":
            self.running[job.offer.device_id] -= 1
        job.state = "succeeded" if ok else "failed"
        job.inputs.clear()
        self._remember(key, job.offer.token, "ran")
        return job

    def never_ran(self, job: Job) -> bool:
        """A job marked running whose run never began (stopped before its first step, by a
        withdrawal handled in the same turn as its start): nothing else frees its slot, which
        stayed taken for good. Let go as a withdrawn job (its inputs kept for its next offer
        here, which may name it: it did not run); whether it was still held."""
        if self.jobs.get(job.key) is not job or job.state != "running":
            return False
        self.running[job.offer.device_id] -= 1
        self._let_go(job, "withdrawn")
        return True

    def _let_go(self, job: Job, how: Ending) -> None:
        """A job that will not run here: gone from `jobs`, remembered with how it went; a
        withdrawn one's inputs kept for its task's next offer here."""
        del self.jobs[job.key]
        job.state = "cancelled"
        self._remember(job.key, job.offer.token, how)
        if how == "withdrawn" and job.inputs:
            had = (job.inputs, job.input_tokens, job.input_types)
            _put_bounded(self._orphans, job.key, had, ORPHANS_KEPT)

    def cancel(self, cmd: CancelCommand) -> list[Job]:
        """Drop the pipeline's jobs; running ones are returned so the shell can stop them."""
        out: list[Job] = []
        pid = cmd.pipeline_id
        if cmd.task_ids is None:  # the whole pipeline: its jobs are found among all
            keys = [k for k in self.jobs if k[0] == pid]
        else:  # named tasks (a re-plan's withdrawal): looked up, not searched for
            keys = [k for k in dict.fromkeys((pid, t) for t in cmd.task_ids) if k in self.jobs]
        for key in keys:
            job = self.jobs[key]
            if cmd.max_token is not None and job.offer.token > cmd.max_token:
                continue  # placed again since: this withdrawal is not about that placement
            if job.state == "running":
                out.append(job)
                continue  # its slot is freed when the shell reports it finished
            # a re-plan's withdrawal names tasks; a whole pipeline's cancel does not
            self._let_go(job, "withdrawn" if cmd.task_ids is not None else "cancelled")
            out.append(job)
        if cmd.task_ids is None and self._orphans:  # the pipeline is over
            for key in [k for k in self._orphans if k[0] == pid]:
                del self._orphans[key]
        return out

    def abandon(self) -> list[Job]:
        """Give up every job (shutdown): queued ones are dropped as cancelled, running ones are
        returned with them so the shell can stop them and report each."""
        out: list[Job] = []
        for job in list(self.jobs.values()):
            if job.state != "running":
                self._let_go(job, "cancelled")
            out.append(job)
        return out

    def finished(self, key: Key) -> bool:
        """The job ran (or was cancelled) here recently: a late duplicate input is harmless.
        Not so for a job a re-plan withdrew: its task is placed again, here or elsewhere, and
        needs the input."""
        done = self._done.get(key)
        return done is not None and done[1] != "withdrawn"

    def _remember(self, key: Key, token: int, how: Ending) -> None:
        _put_bounded(self._done, key, (token, how), REMEMBERED)

    def remember_end(self, key: Key, token: int, subject: str, event_id: str, data: bytes) -> None:
        _put_bounded(self._ends, key, (token, subject, event_id, data), REMEMBERED)

    def end_of(self, key: Key, token: int) -> tuple[str, str, bytes] | None:
        """The end event (subject, event id, data) a job ended with here under `token`, while
        remembered."""
        end = self._ends.get(key)
        return end[1:] if end is not None and end[0] == token else None

    @property
    def running_total(self) -> int:
        return sum(self.running.values())


class Overlaps:
    """How many other jobs an agent ran alongside each running one (the most at any time
    while it ran), said on its end event (`TaskEvent.shared`): the predictor keeps runs
    that shared the agent apart from those that ran alone. A job's start updates the jobs
    running then (as many as the agent's slots: cheap); its end reads its own."""

    def __init__(self) -> None:
        #: id of each running job -> the most other jobs seen running with it.
        self._peak: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._peak)

    def begin(self, job: object) -> None:
        others = len(self._peak)
        if others:
            for k, seen in self._peak.items():
                if seen < others:
                    self._peak[k] = others
        self._peak[id(job)] = others

    def end(self, job: object) -> int:
        """The most other jobs that ran with `job` (0 if it ran alone or was not begun)."""
        return self._peak.pop(id(job), 0)
