"""A discrete-event simulator that runs the real scheduler core on thousands of devices.

Why: a fleet of 10,000 devices cannot be rented, but the placement decisions can be made by
exactly the code the orchestrator runs (`orchestrator.scheduling`, through a `Policy`) and
their consequences played out in simulated time.

Model (one event queue, `heapq`, ties in insertion order):

- **Arrival**: a pipeline is planned by the policy at its arrival time on the cluster as it
  is then: every other pipeline's running and queued tasks are per-slot busy windows (their
  planned windows, pushed back behind late predecessors on the same slot). The planning call
  is timed with `perf_counter` (real seconds on this machine).
- **Execution is dataflow in plan order**, as the agents do it: each device slot runs the
  tasks placed on it in planned-start order; a task starts when it is first in its slot's
  queue, the slot is free and all inputs have arrived (producer's finish + the cost model's
  transfer time between the two devices; links are not shared, as in the planner's model).
  Its duration is the cost model's compute time on the device's current speed, times a
  lognormal factor with mean 1 (`noise_sigma` 0: exactly the planned time, so a lone
  pipeline finishes exactly at its plan's makespan). Zero-length tasks take no slot.
- **Slowdown**: a device's speed is multiplied by a factor; running tasks finish their
  remaining work at the new speed, later tasks are timed at it, the planner sees it at once.
- **Failure**: a device (or its whole agent) dies; its running tasks are lost. The control
  plane notices after a `Detection` delay; then every pipeline with work on the dead devices
  is re-planned by the same policy with finished and running tasks (on live devices) fixed
  and the rest placed from "now" on live devices only. Outputs held only by a dead device are
  lost, so finished tasks whose outputs are still needed run again. Re-placed tasks start no
  earlier than detection + the measured re-planning time (or `replan_s`), and inputs already
  produced are shipped from then on.

Recovery of a failure: from the crash until every task that was running on the dead devices
runs again elsewhere (see `FailureRecord`).

Same random draws for every policy: each purpose has its own random stream, seeded from
`SimConfig.seed` and what the draw is for, never one stream consumed in the order a policy's
events happen. A task's duration factor is drawn for (pipeline, task, attempt), whatever
device and time it runs at; failure k's detection delay from (k); the device an unnamed
failure or slowdown hits is the first busy live device in a random order of all devices drawn
for that event (so two policies lose the same node when it is busy under both). Arrivals and
incident times are the scenario's, shared as they are.

Planning time: before the first arrival the policy plans that arrival's pipeline once, on a
copy, and the result is dropped (`SimConfig.warmup`), so one-off costs of a first call
(imports, compilation, caches) do not land in the timed planning calls.
"""

from __future__ import annotations

import contextlib
import copy
import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from orchestrator.scheduling import (
    Cluster,
    CostModel,
    Device,
    Placement,
    Plan,
    TaskGraph,
    Unschedulable,
)
from sim.des_events import (
    Arrival,
    ExecRecord,
    Failure,
    FailureRecord,
    PipelineRecord,
    Slowdown,
    SlowdownRecord,
)
from sim.detection import HEARTBEAT, Detection
from sim.policies import Occupancy, Policy

QUEUED, RUNNING, DONE = 0, 1, 2

NOISE, DETECT, FAIL_PICK, SLOW_PICK = range(1, 5)
"""What a random stream is for (the second word of its seed, after `SimConfig.seed`)."""

_ARRIVE, _FINISH, _READY, _FAIL, _DETECT, _SLOW = range(6)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of one run. `replan_s` None: charge the measured wall time of each re-planning
    call to recovery (sequential re-plans add up); a number: charge that instead."""

    noise_sigma: float = 0.0
    seed: int = 0
    detection: Detection = HEARTBEAT
    replan_s: float | None = None
    warmup: bool = True

    def __post_init__(self) -> None:
        if not self.noise_sigma >= 0:
            raise ValueError("noise_sigma must be >= 0")


@dataclass(slots=True)
class SimResult:
    """Everything a run produced; `wall_s` is the real time the whole simulation took."""

    policy: str
    pipelines: list[PipelineRecord]
    executions: list[ExecRecord]
    plan_wall_s: list[float]
    replan_wall_s: list[float]
    failures: list[FailureRecord]
    slowdowns: list[SlowdownRecord]
    plans: dict[int, Plan]
    capacity: list[tuple[int, float, float]]
    """(slots, alive from, alive until) per device: what utilisation is measured against."""
    warmup_wall_s: float = math.nan
    """The untimed warm-up plan's wall time (not in `plan_wall_s`); NaN when none ran."""
    wall_s: float = 0.0
    end: float = 0.0
    events: int = 0
    config: SimConfig = field(default_factory=SimConfig)


class _Pipe:
    """Mutable state of one pipeline's tasks (index-based, as the TaskGraph)."""

    __slots__ = (
        "attempts",
        "dev",
        "done",
        "expect",
        "finish",
        "gen",
        "graph",
        "key",
        "pending",
        "pfinish",
        "pstart",
        "ready",
        "rec",
        "release",
        "slot",
        "start",
        "status",
        "topo_pos",
        "z",
    )

    def __init__(self, graph: TaskGraph, rec: PipelineRecord) -> None:
        n = len(graph)
        self.graph, self.rec = graph, rec
        self.status = [QUEUED] * n
        self.dev = [-1] * n
        self.slot = [0] * n
        self.pstart = [0.0] * n
        self.pfinish = [0.0] * n
        self.start = [math.nan] * n
        self.finish = [math.nan] * n
        self.expect = [0.0] * n
        self.gen = [0] * n
        self.pending = [len(p) for p in graph.preds]
        self.ready: list[float | None] = [None] * n
        self.release = [rec.arrival] * n
        self.done = 0
        self.attempts = [0] * n
        self.z: list[float] = []
        self.topo_pos = [0] * n
        for pos, i in enumerate(graph.topo):
            self.topo_pos[i] = pos
        self.key = rec.index


QueueEntry = tuple[float, float, int, int, int, int]  # pstart, pfinish, pipe, topo, task, gen


class Simulator:
    """One policy on one scenario; `run()` plays it out and returns a `SimResult`."""

    def __init__(
        self,
        cluster: Cluster,
        cost: CostModel,
        policy: Policy,
        arrivals: Sequence[Arrival],
        *,
        failures: Sequence[Failure] = (),
        slowdowns: Sequence[Slowdown] = (),
        config: SimConfig | None = None,
    ) -> None:
        if any(d.busy or d.slot_busy for d in cluster.devices):
            raise ValueError("the simulated cluster must start idle (no busy windows)")
        self.cost, self.policy = cost, policy
        self.config = config or SimConfig()
        self.base: list[Device] = list(cluster.devices)
        self.actual: list[Device] = list(cluster.devices)
        self.index = dict(cluster.index)
        self.alive = [True] * len(self.base)
        self.known_dead = [False] * len(self.base)
        self.died = [math.inf] * len(self.base)
        self.slot_of: list[int] = []
        self.slot_dev: list[int] = []
        for d, dev in enumerate(self.base):
            self.slot_of.append(len(self.slot_dev))
            self.slot_dev.extend([d] * dev.slots)
        ns = len(self.slot_dev)
        self.running: list[tuple[int, int] | None] = [None] * ns
        self.queue: list[list[QueueEntry]] = [[] for _ in range(ns)]
        self.active: set[int] = set()
        self.by_device: list[set[int]] = [set() for _ in self.base]
        self.view = cluster
        self.view_of: list[int] = list(range(len(self.base)))
        self.pipes: list[_Pipe] = []
        self.events: list[tuple[float, int, int, tuple[int, ...]]] = []
        self.seq = 0
        self.now = 0.0
        self.n_events = 0
        self.executions: list[ExecRecord] = []
        self.plan_wall: list[float] = []
        self.replan_wall: list[float] = []
        self.failures: list[FailureRecord] = []
        self.slow_records: list[SlowdownRecord] = []
        self.plans: dict[int, Plan] = {}
        self.awaiting: dict[tuple[int, int], FailureRecord] = {}
        self.true_end: dict[tuple[int, int], float] = {}
        self.arrivals = sorted(arrivals, key=lambda a: a.at)
        for k, a in enumerate(self.arrivals):
            self._push(a.at, _ARRIVE, (k,))
        self.fail_specs = sorted(failures, key=lambda f: f.at)
        for k, f in enumerate(self.fail_specs):
            self._push(f.at, _FAIL, (k,))
        self.slow_specs = sorted(slowdowns, key=lambda s: s.at)
        for k, s in enumerate(self.slow_specs):
            self._push(s.at, _SLOW, (k,))

    # -- event loop ------------------------------------------------------------------------

    def _push(self, at: float, kind: int, payload: tuple[int, ...]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, payload))

    def stream(self, purpose: int, *key: int) -> np.random.Generator:
        """The random stream for one purpose and key (see the module doc)."""
        return np.random.default_rng([self.config.seed, purpose, *key])

    def _noise(self, p: int, i: int) -> float:
        """Standard normal draw for task i of pipeline p, this attempt of it."""
        pipe = self.pipes[p]
        k = pipe.attempts[i]
        pipe.attempts[i] += 1
        if k == 0:
            if not pipe.z:  # one stream per pipeline for the first attempts
                pipe.z = self.stream(NOISE, p).standard_normal(len(pipe.graph)).tolist()
            return pipe.z[i]
        return float(self.stream(NOISE, p, i, k).standard_normal())

    def _warmup(self) -> float:
        """Plan the first arrival once on a copy of the policy, untimed; its wall seconds."""
        if not self.config.warmup or not self.arrivals:
            return math.nan
        policy = copy.deepcopy(self.policy)  # a cursor or random stream must not move
        m = len(self.view)
        occ = Occupancy(0.0, np.zeros(m, dtype=np.float64), np.zeros(m, dtype=np.float64))
        graph = self.arrivals[0].graph
        t0 = time.perf_counter()
        with contextlib.suppress(Unschedulable):  # a rejected pipeline warms up too
            policy.plan(graph, self.view, self.cost, fixed={}, now=0.0, occ=occ)
        return time.perf_counter() - t0

    def run(self) -> SimResult:
        warm = self._warmup()
        started = time.perf_counter()
        handlers = {
            _ARRIVE: self._on_arrival,
            _FINISH: self._on_finish,
            _READY: self._on_ready_event,
            _FAIL: self._on_fail,
            _DETECT: self._on_detect,
            _SLOW: self._on_slow,
        }
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            self.now = at
            self.n_events += 1
            handlers[kind](payload)
        capacity = [(dev.slots, 0.0, self.died[d]) for d, dev in enumerate(self.base)]
        return SimResult(
            policy=self.policy.name,
            pipelines=[p.rec for p in self.pipes],
            executions=self.executions,
            plan_wall_s=self.plan_wall,
            replan_wall_s=self.replan_wall,
            failures=self.failures,
            slowdowns=self.slow_records,
            plans=self.plans,
            capacity=capacity,
            warmup_wall_s=warm,
            wall_s=time.perf_counter() - started,
            end=self.now,
            events=self.n_events,
            config=self.config,
        )

    # -- planning --------------------------------------------------------------------------

    def _occupancy(self, exclude: int) -> tuple[Cluster, Occupancy]:
        """The planner's view now: other pipelines' work as per-slot busy windows."""
        now, view = self.now, self.view
        m = len(view)
        load = np.zeros(m, dtype=np.float64)
        free_at = np.full(m, now, dtype=np.float64)
        windows: dict[int, list[tuple[int, float, float]]] = {}
        tails: dict[int, list[float]] = {}
        for sid in self.active:
            d = self.slot_dev[sid]
            v = self.view_of[d]
            if v < 0:
                continue
            k = sid - self.slot_of[d]
            cursor = now
            mine: list[tuple[int, float, float]] = []
            run = self.running[sid]
            if run is not None:
                pipe = self.pipes[run[0]]
                cursor = max(pipe.expect[run[1]], now)
                if run[0] != exclude:
                    mine.append((k, pipe.start[run[1]], cursor))
            for ps, pf, p, _, i, gen in sorted(self.queue[sid]):
                pipe = self.pipes[p]
                if p == exclude or pipe.gen[i] != gen or pipe.status[i] != QUEUED:
                    continue
                s = max(ps, cursor)
                cursor = s + (pf - ps)
                mine.append((k, s, cursor))
            if mine:
                windows.setdefault(v, []).extend(mine)
                load[v] += sum(e - max(s, now) for _, s, e in mine if e > now)
            tails.setdefault(v, []).append(cursor)
        for v, ends in tails.items():
            if len(ends) >= view.slots[v]:
                free_at[v] = min(ends)
        overlay = {v: tuple(w) for v, w in windows.items()}
        planned = view.with_slot_busy(overlay) if overlay else view
        return planned, Occupancy(now, load, free_at)

    def _plan(
        self, p: int, graph: TaskGraph, fixed: dict[str, Placement]
    ) -> tuple[Plan | None, float, str]:
        """(plan or None, wall seconds, why not) for pipeline p on the current view."""
        cluster, occ = self._occupancy(p)
        t0 = time.perf_counter()
        try:
            plan = self.policy.plan(graph, cluster, self.cost, fixed=fixed, now=self.now, occ=occ)
        except Unschedulable as exc:
            return None, time.perf_counter() - t0, f"unschedulable: {len(exc.reasons)} task(s)"
        return plan, time.perf_counter() - t0, ""

    def _apply(self, p: int, plan: Plan, tasks: Sequence[int], release: float) -> None:
        """Queue `tasks` of pipeline p where `plan` put them, startable from `release`."""
        pipe = self.pipes[p]
        ids = pipe.graph.ids
        left: set[int] = set()  # slots whose queue held a task moved away: may unblock
        for i in tasks:
            if pipe.dev[i] >= 0 and pipe.pfinish[i] > pipe.pstart[i]:
                left.add(self.slot_of[pipe.dev[i]] + pipe.slot[i])
            pl = plan.placements[ids[i]]
            d = self.index[pl.device_id]
            pipe.gen[i] += 1
            pipe.status[i] = QUEUED
            pipe.dev[i], pipe.slot[i] = d, pl.slot
            pipe.pstart[i], pipe.pfinish[i] = pl.start, pl.finish
            pipe.release[i] = release
            pipe.ready[i] = None
            self.by_device[d].add(p)
            if pl.finish > pl.start:
                sid = self.slot_of[d] + pl.slot
                entry = (pl.start, pl.finish, p, pipe.topo_pos[i], i, pipe.gen[i])
                heapq.heappush(self.queue[sid], entry)
                self.active.add(sid)
        for i in tasks:
            if pipe.pending[i] == 0:
                self._inputs_known(p, i)
        for sid in sorted(left):
            self._try_start(sid)

    # -- handlers --------------------------------------------------------------------------

    def _on_arrival(self, payload: tuple[int, ...]) -> None:
        a = self.arrivals[payload[0]]
        p = len(self.pipes)
        rec = PipelineRecord(p, a.name or f"p{p}", len(a.graph), a.at)
        self.pipes.append(_Pipe(a.graph, rec))
        plan, wall, why = self._plan(p, a.graph, {})
        self.plan_wall.append(wall)
        if plan is None:
            rec.rejected = why
            return
        self.plans[p] = plan
        rec.planned_finish = plan.makespan
        if not len(a.graph):
            rec.completed = rec.first_start = a.at
            return
        self._apply(p, plan, range(len(a.graph)), a.at)

    def _inputs_known(self, p: int, i: int) -> None:
        """All of task i's producers finished: when do its inputs arrive where it runs?"""
        pipe = self.pipes[p]
        d = pipe.dev[i]
        dst = self.base[d]
        rel = pipe.release[i]
        at = rel
        for j, nbytes in pipe.graph.preds[i]:
            src = self.base[pipe.dev[j]]
            fin = pipe.finish[j]
            arrive = (fin if fin >= rel else rel) + self.cost.transfer_time(nbytes, src, dst)
            if arrive > at:
                at = arrive
        pipe.ready[i] = at
        if at > self.now:
            self._push(at, _READY, (p, i, pipe.gen[i]))
        else:
            self._on_ready(p, i)

    def _on_ready_event(self, payload: tuple[int, ...]) -> None:
        p, i, gen = payload
        if self.pipes[p].gen[i] == gen:
            self._on_ready(p, i)

    def _on_ready(self, p: int, i: int) -> None:
        pipe = self.pipes[p]
        if pipe.status[i] != QUEUED:
            return
        if pipe.pfinish[i] > pipe.pstart[i]:
            self._try_start(self.slot_of[pipe.dev[i]] + pipe.slot[i])
        elif self.alive[pipe.dev[i]]:  # zero-length: takes no slot
            self._begin(p, i, -1, 0.0)

    def _try_start(self, sid: int) -> None:
        if self.running[sid] is not None or not self.alive[self.slot_dev[sid]]:
            return
        q = self.queue[sid]
        while q:
            _, _, p, _, i, gen = q[0]
            pipe = self.pipes[p]
            if pipe.gen[i] != gen or pipe.status[i] != QUEUED:
                heapq.heappop(q)
                continue
            ready = pipe.ready[i]
            if ready is None or ready > self.now:
                return
            heapq.heappop(q)
            task = pipe.graph.tasks[i]
            dur = self.cost.compute_time(task, self.actual[pipe.dev[i]])
            self._begin(p, i, sid, dur)
            return
        self.active.discard(sid)

    def _begin(self, p: int, i: int, sid: int, planned: float) -> None:
        pipe = self.pipes[p]
        dur = planned
        if self.config.noise_sigma > 0 and planned > 0:
            s = self.config.noise_sigma
            dur = planned * math.exp(-s * s / 2 + s * self._noise(p, i))
        pipe.status[i] = RUNNING
        pipe.start[i] = self.now
        pipe.expect[i] = self.now + planned
        if math.isnan(pipe.rec.first_start):
            pipe.rec.first_start = self.now
        if sid >= 0:
            self.running[sid] = (p, i)
        fr = self.awaiting.pop((p, i), None)
        if fr is not None:  # an interrupted task runs again
            fr.recovered = self.now if math.isnan(fr.recovered) else max(fr.recovered, self.now)
        self.true_end[(p, i)] = self.now + dur
        self._push(self.now + dur, _FINISH, (p, i, pipe.gen[i]))

    def _on_finish(self, payload: tuple[int, ...]) -> None:
        p, i, gen = payload
        pipe = self.pipes[p]
        if pipe.gen[i] != gen or pipe.status[i] != RUNNING:
            return
        d = pipe.dev[i]
        pipe.status[i] = DONE
        pipe.finish[i] = self.now
        self.true_end.pop((p, i), None)
        pipe.done += 1
        slotted = pipe.pfinish[i] > pipe.pstart[i]
        self.executions.append(
            ExecRecord(p, pipe.graph.ids[i], self.base[d].id, pipe.slot[i], pipe.start[i], self.now)
        )
        for j, _ in pipe.graph.succs[i]:
            pipe.pending[j] -= 1
            if pipe.pending[j] == 0 and pipe.status[j] == QUEUED:
                self._inputs_known(p, j)
        if pipe.done == len(pipe.graph):
            pipe.rec.completed = self.now
            for dd in set(pipe.dev):
                self.by_device[dd].discard(p)
        if slotted:
            sid = self.slot_of[d] + pipe.slot[i]
            if self.running[sid] == (p, i):
                self.running[sid] = None
            self._try_start(sid)

    def _pick(self, device: str | None, whole_agent: bool, rng: np.random.Generator) -> list[int]:
        """The device(s) an event hits: named, else the first busy live device in a random
        order of all devices drawn from `rng` (the first live one when none is busy)."""
        if device is not None:
            chosen = self.index[device]
        else:
            busy = {self.slot_dev[s] for s, r in enumerate(self.running) if r is not None}
            order = rng.permutation(len(self.base)).tolist()
            live = [d for d in order if self.alive[d]]
            if not live:
                return []
            chosen = next((d for d in live if d in busy), live[0])
        if not whole_agent:
            return [chosen]
        agent = self.base[chosen].agent_id
        return [d for d, dev in enumerate(self.base) if dev.agent_id == agent and self.alive[d]]

    def _on_fail(self, payload: tuple[int, ...]) -> None:
        k = payload[0]
        spec = self.fail_specs[k]
        hit = self._pick(spec.device, spec.whole_agent, self.stream(FAIL_PICK, k))
        if not hit:
            return
        rec = FailureRecord(
            at=self.now,
            devices=tuple(self.base[d].id for d in hit),
            detection_s=self.config.detection.sample(self.stream(DETECT, k)),
        )
        for d in hit:
            self.alive[d] = False
            self.died[d] = self.now
            for sid in range(self.slot_of[d], self.slot_of[d] + self.base[d].slots):
                run = self.running[sid]
                if run is None:
                    continue
                p, i = run
                pipe = self.pipes[p]
                self.executions.append(
                    ExecRecord(
                        p,
                        pipe.graph.ids[i],
                        self.base[d].id,
                        pipe.slot[i],
                        pipe.start[i],
                        self.now,
                        killed=True,
                    )
                )
                pipe.status[i] = QUEUED
                pipe.gen[i] += 1
                self.true_end.pop((p, i), None)
                self.running[sid] = None
                self.awaiting[(p, i)] = rec
                rec.interrupted += 1
        self.failures.append(rec)
        self._push(self.now + rec.detection_s, _DETECT, (len(self.failures) - 1,))

    def _rebuild_view(self) -> None:
        keep = [d for d in range(len(self.base)) if not self.known_dead[d]]
        self.view = Cluster([self.actual[d] for d in keep])
        self.view_of = [-1] * len(self.base)
        for v, d in enumerate(keep):
            self.view_of[d] = v

    def _on_detect(self, payload: tuple[int, ...]) -> None:
        rec = self.failures[payload[0]]
        rec.detected = self.now
        dead = [self.index[x] for x in rec.devices]
        for d in dead:
            self.known_dead[d] = True
            for sid in range(self.slot_of[d], self.slot_of[d] + self.base[d].slots):
                self.queue[sid] = []
                self.active.discard(sid)
        self._rebuild_view()
        affected = sorted({p for d in dead for p in self.by_device[d]})
        release = self.now
        for p in affected:
            pipe = self.pipes[p]
            if pipe.rec.completed is not None or pipe.rec.rejected:
                continue
            todo, fixed = self._replan_set(pipe)
            if not todo:
                continue
            sub = _subgraph(pipe.graph, todo, fixed)
            fixed_pl = {
                pipe.graph.ids[j]: Placement(
                    pipe.graph.ids[j],
                    self.base[pipe.dev[j]].id,
                    pipe.slot[j],
                    pipe.start[j],
                    pipe.finish[j] if pipe.status[j] == DONE else max(pipe.expect[j], self.now),
                )
                for j in fixed
            }
            plan, wall, why = self._plan(p, sub, fixed_pl)
            self.replan_wall.append(wall)
            rec.wall_replan_s.append(wall)
            release += wall if self.config.replan_s is None else self.config.replan_s
            rec.pipelines += 1
            if plan is None:
                pipe.rec.rejected = f"re-plan failed: {why}"
                self._drop(p)
                continue
            pipe.rec.replans += 1
            for j in todo:
                if pipe.status[j] == DONE:  # its output died with its device: run it again
                    pipe.status[j] = QUEUED
                    pipe.done -= 1
            for j in range(len(pipe.graph)):
                pipe.pending[j] = sum(1 for q, _ in pipe.graph.preds[j] if pipe.status[q] != DONE)
            rec.requeued += len(todo)
            self._apply(p, plan, todo, release)
        rec.replaced = release
        if not any(v is rec for v in self.awaiting.values()):
            rec.recovered = release if math.isnan(rec.recovered) else max(rec.recovered, release)

    def _drop(self, p: int) -> None:
        """Give up on pipeline p: its queued tasks leave their slots' queues."""
        pipe = self.pipes[p]
        for key in [k for k in self.awaiting if k[0] == p]:
            del self.awaiting[key]
        for i in range(len(pipe.graph)):
            if pipe.status[i] == QUEUED:
                pipe.gen[i] += 1
                if pipe.dev[i] >= 0 and pipe.pfinish[i] > pipe.pstart[i]:
                    self._try_start(self.slot_of[pipe.dev[i]] + pipe.slot[i])

    def _replan_set(self, pipe: _Pipe) -> tuple[list[int], list[int]]:
        """(tasks to place again, tasks to keep fixed) after devices died: every unstarted
        or interrupted task, plus finished ones whose only copy of an output still needed
        died; fixed are the finished/running producers (on live devices) of those."""
        status, alive, dev = pipe.status, self.alive, pipe.dev
        preds = pipe.graph.preds
        todo = {i for i in range(len(pipe.graph)) if status[i] == QUEUED}
        stack = list(todo)
        fixed: set[int] = set()
        while stack:
            i = stack.pop()
            for j, _ in preds[i]:
                if j in todo or j in fixed:
                    continue
                if status[j] == QUEUED or not alive[dev[j]]:
                    todo.add(j)  # a lost output (or a lost running producer): redo it
                    stack.append(j)
                else:
                    fixed.add(j)
        return sorted(todo), sorted(fixed)

    def _on_slow(self, payload: tuple[int, ...]) -> None:
        spec = self.slow_specs[payload[0]]
        hit = self._pick(spec.device, False, self.stream(SLOW_PICK, payload[0]))
        if not hit:
            return
        d = hit[0]
        f = spec.factor
        dev = self.actual[d]
        self.actual[d] = replace(dev, speed=dev.speed * f)
        running = 0
        for sid in range(self.slot_of[d], self.slot_of[d] + dev.slots):
            run = self.running[sid]
            if run is None:
                continue
            p, i = run
            pipe = self.pipes[p]
            pipe.expect[i] = self.now + max(0.0, pipe.expect[i] - self.now) / f
            end = self.now + max(0.0, self.true_end[(p, i)] - self.now) / f
            self.true_end[(p, i)] = end
            pipe.gen[i] += 1
            self._push(end, _FINISH, (p, i, pipe.gen[i]))
            running += 1
        self.slow_records.append(SlowdownRecord(self.now, dev.id, f, running))
        if not self.known_dead[d]:
            self._rebuild_view()


def _subgraph(graph: TaskGraph, todo: Sequence[int], fixed: Sequence[int]) -> TaskGraph:
    """The tasks to re-plan and their fixed producers; only edges into re-planned tasks
    (edges into fixed tasks are already satisfied)."""
    keep = set(todo)
    ids = graph.ids
    tasks = [graph.tasks[i] for i in sorted(keep | set(fixed))]
    edges = {(ids[j], ids[i]): b for i in todo for j, b in graph.preds[i]}
    return TaskGraph(tasks, edges)
