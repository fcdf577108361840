"""Adaptive re-scheduling: when the plan stops matching reality, move work only if it pays.

Triggers: a critical-path task running later than predicted by `late_threshold` (default 30%),
a device's calibrated speed dropping by `drift_threshold` or more (default 15%; from
`CalibrationDrift` notices or an advert's new figure), and a higher-priority arrival (handled
by preemption; only logged here). Each trigger is priced the same way, by pure functions:

    gain = makespan if we keep the current assignment (re-timed with what we now know)
         - makespan of a re-plan of the unstarted work with everything else fixed (HEFT)
    cost = transfer of already-produced inputs to each moved task's new device
         + progress lost by each running task restarted elsewhere + a per-move overhead

and work moves only when `gain > 2 * cost`. Non-migratable tasks never move. Every decision is
logged (structured log and the pipeline's `placement_log`) with both numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from orchestrator.placement.placer import PlacementFailed, descendants
from orchestrator.placement.planning import (
    SpecCostModel,
    store_costs,
    to_graph,
    warm_models,
    with_bookings,
)
from orchestrator.reservations.book import Blocking
from orchestrator.reservations.store import device_key_of
from orchestrator.scheduling import (
    BatchCostModel,
    Cluster,
    CostModel,
    Device,
    Placement,
    Task,
    TaskGraph,
    Unschedulable,
    heft,
)
from orchestrator.scheduling.transfer import TransferTable
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.agent import AgentAdvert, CalibrationDrift, DeviceSpec
from schemas.codec import DecodeError, decode
from schemas.events import TaskEvent
from schemas.placement import EvictNotice

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from orchestrator.ports import AdaptiveDoor

log = logging.getLogger("mars.adaptive")
GAIN_FACTOR = 2.0
LATE_THRESHOLD = 0.30
#: A task must also be at least this much past its prediction to count as late: below it,
#: lateness is event and timer jitter, not a slow device (and a 2 ms task 1 ms late would
#: otherwise price a re-plan hundreds of times a second on a busy orchestrator).
LATE_FLOOR_S = 0.05
DRIFT_THRESHOLD = 0.15
#: Offer + commit + cancel round trips a move costs even without data to ship.
MOVE_OVERHEAD_S = 0.02
#: A consumer is not moved while one of its producers is projected to finish within this:
#: the move (cancel, re-offer, reroute) must land before that producer ships its output.
MOVE_RACE_S = 0.5
#: At most one lateness pricing per pipeline in this long: on a loaded orchestrator the tasks
#: of one pipeline go late together (the same cause), and each pricing re-plans the pipeline
#: twice; a task found late within the gap is looked at again when it ends.
LATE_GAP_S = 0.25
#: A late task still running is priced again each time its run has grown this many times
#: longer: what it is modelled to have left (its overrun so far) grows with it, and a move
#: that did not pay at the first look may pay later.
LATE_REGROW = 1.5


async def one_turn() -> None:
    """One turn of the event loop."""
    await asyncio.sleep(0)


# -- the rule (pure) ------------------------------------------------------------------------------
def worth_moving(gain_s: float, cost_s: float, factor: float = GAIN_FACTOR) -> bool:
    """Re-plan only when the makespan saved exceeds `factor` times the cost of moving work."""
    return math.isfinite(gain_s) and gain_s > factor * max(0.0, cost_s)


def is_late(elapsed_s: float, predicted_s: float, threshold: float = LATE_THRESHOLD) -> bool:
    return predicted_s > 0.0 and elapsed_s > predicted_s * (1.0 + threshold)


def speed_dropped(before: float, after: float, threshold: float = DRIFT_THRESHOLD) -> bool:
    return before > 0.0 and after <= before * (1.0 - threshold)


@dataclass(frozen=True)
class Decision:
    pipeline_id: str
    trigger: str
    gain_s: float
    cost_s: float
    replan: bool
    moved: tuple[str, ...] = ()
    makespan_keep_s: float = 0.0
    makespan_replan_s: float = 0.0
    why: str = ""
    factor: float = GAIN_FACTOR

    def line(self) -> str:
        return (
            f"adaptive: trigger={self.trigger} gain_s={self.gain_s:.3f} cost_s={self.cost_s:.3f} "
            f"factor={self.factor:g} decision={'replan' if self.replan else 'keep'} "
            f"moved={','.join(self.moved) or '-'} makespan_keep_s={self.makespan_keep_s:.3f} "
            f"makespan_replan_s={self.makespan_replan_s:.3f}"
            + (f" ({self.why})" if self.why else "")
        )


class ScaledCost:
    """The planning cost model with some devices slower by a factor, non-migratable tasks held
    on their device and some (task, device) pairs ruled out; same answers per pair and batch."""

    def __init__(
        self,
        base: BatchCostModel,
        slower: Mapping[str, float],
        pinned: Mapping[str, str],
        banned: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self.base, self.slower, self.pinned, self.banned = base, slower, pinned, banned

    def _ruled_out(self, task_id: str, device_id: str) -> bool:
        pin = self.pinned.get(task_id)
        return (pin is not None and pin != device_id) or (task_id, device_id) in self.banned

    def compute_time(self, task: Task, device: Device) -> float:
        if self._ruled_out(task.id, device.id):
            return math.inf
        return self.base.compute_time(task, device) * self.slower.get(device.id, 1.0)

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float:
        return self.base.transfer_time(nbytes, src, dst)

    def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
        out = np.array(self.base.compute_matrix(tasks, cluster), dtype=np.float64)
        for j, d in enumerate(cluster.devices):
            f = self.slower.get(d.id)
            if f is not None:
                out[:, j] *= f
        for i, t in enumerate(tasks):
            for j, d in enumerate(cluster.devices):
                if self._ruled_out(t.id, d.id):
                    out[i, j] = math.inf
        return out

    def transfer_table(self, cluster: Cluster) -> TransferTable:
        return self.base.transfer_table(cluster)


def _earliest(dev: Device, slot: int, start: float, dur: float) -> float:
    """First start >= `start` where [s, s + dur) misses the slot's busy windows."""
    s = start
    for bs, be in sorted(dev.windows(slot)):
        if s + dur <= bs or be <= s:
            continue
        s = max(s, be)
    return s


def retime(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    current: Mapping[str, Placement],
    fixed: Mapping[str, Placement],
    now: float,
) -> dict[str, Placement]:
    """The current assignment (device, slot, order) with times recomputed under `cost`."""
    out = dict(fixed)
    free: dict[tuple[str, int], float] = {}
    for p in fixed.values():
        free[(p.device_id, p.slot)] = max(free.get((p.device_id, p.slot), 0.0), p.finish)
    topo = {i: k for k, i in enumerate(graph.topo)}
    pending = sorted(
        (t for t in current if t not in fixed),
        key=lambda t: (current[t].start, topo[graph.index[t]]),
    )
    while pending:  # a start order that breaks precedence (never from a valid plan) still ends
        progressed = False
        for tid in list(pending):
            preds = [graph.ids[i] for i, _ in graph.preds[graph.index[tid]]]
            if any(d not in out for d in preds):
                continue
            p = current[tid]
            dev = cluster.device(p.device_id)
            ready = now
            for i, nbytes in graph.preds[graph.index[tid]]:
                d = out[graph.ids[i]]
                src = cluster.device(d.device_id)
                ready = max(ready, d.finish + cost.transfer_time(nbytes, src, dev))
            dur = cost.compute_time(graph.task(tid), dev)
            start = _earliest(dev, p.slot, max(ready, free.get((dev.id, p.slot), 0.0)), dur)
            out[tid] = Placement(tid, dev.id, p.slot, start, start + dur)
            free[(dev.id, p.slot)] = start + dur
            pending.remove(tid)
            progressed = True
        if not progressed:
            raise ValueError(f"cannot re-time {pending}: predecessors never placed")
    return out


def makespan(placements: Mapping[str, Placement]) -> float:
    return max((p.finish for p in placements.values()), default=0.0)


@dataclass(frozen=True)
class Situation:
    """A pipeline as it stands: plan, facts so far, and what the trigger taught us."""

    graph: TaskGraph
    cluster: Cluster
    cost: BatchCostModel
    #: The current assignment of every task (plan times).
    current: Mapping[str, Placement]
    #: Finished tasks at their actual times, running ones from their start to their projection.
    done: Mapping[str, Placement]
    running: Mapping[str, Placement]
    #: Seconds each running task has run (lost if it is restarted elsewhere).
    elapsed: Mapping[str, float]
    now: float
    #: Device -> how much slower than the model thinks (1.0: as modelled).
    slower: Mapping[str, float] = field(default_factory=dict)
    #: Tasks that must not move.
    pinned: frozenset[str] = frozenset()
    #: Running tasks that may be restarted elsewhere (e.g. on a slowed device).
    restartable: frozenset[str] = frozenset()
    overhead_s: float = MOVE_OVERHEAD_S


@dataclass(frozen=True)
class Option:
    gain_s: float
    cost_s: float
    moved: dict[str, Placement]
    keep_s: float
    replan_s: float

    def net(self, factor: float = GAIN_FACTOR) -> float:
        return self.gain_s - factor * self.cost_s


def move_cost(
    s: Situation, cost: CostModel, plan: Mapping[str, Placement], moved: Mapping[str, Placement]
) -> float:
    """What moving costs on top of the plan: each moved task's inputs shipped to its new
    device, the progress of a restarted task thrown away, and a per-move overhead."""
    total = 0.0
    for tid, new in moved.items():
        dev = s.cluster.device(new.device_id)
        for i, nbytes in s.graph.preds[s.graph.index[tid]]:
            src = plan[s.graph.ids[i]]
            total += cost.transfer_time(nbytes, s.cluster.device(src.device_id), dev)
        total += s.elapsed.get(tid, 0.0) + s.overhead_s
    return total


def keep_makespan(s: Situation) -> float:
    """When the pipeline ends if nothing moves, given what we now know."""
    cost = ScaledCost(s.cost, s.slower, {})
    fixed = {**s.done, **s.running}
    return makespan(retime(s.graph, s.cluster, cost, s.current, fixed, s.now))


def most_to_gain(s: Situation, keep_s: float) -> float:
    """An upper bound on what any re-plan saves: every task it places starts at `now` at the
    earliest, so no re-plan that moves anything ends before `now`."""
    return keep_s - s.now


def cannot_pay(s: Situation, keep_s: float, factor: float = GAIN_FACTOR) -> bool:
    """No move can be worth it: each moved task costs at least the per-move overhead, and the
    whole remaining time does not exceed `factor` times that (checked before pricing, which
    re-plans the pipeline once or twice)."""
    return most_to_gain(s, keep_s) <= factor * max(0.0, s.overhead_s)


def _option(s: Situation, restart: frozenset[str], keep: float) -> Option:
    unstarted = {t for t in s.current if t not in s.done and t not in s.running}
    replanned = unstarted | restart
    pinned = {t: s.current[t].device_id for t in replanned if t in s.pinned}
    banned = frozenset((t, s.current[t].device_id) for t in restart)
    cost = ScaledCost(s.cost, s.slower, pinned, banned)
    fixed = {**s.done, **{t: p for t, p in s.running.items() if t not in restart}}
    plan = heft(s.graph, s.cluster, cost, fixed=fixed, now=s.now)
    moved = {
        t: p for t, p in plan.placements.items()
        if t in replanned and p.device_id != s.current[t].device_id
    }  # fmt: skip
    price = move_cost(s, cost, plan.placements, moved)
    return Option(keep - plan.makespan, price, moved, keep, plan.makespan)


def evaluate(s: Situation, factor: float = GAIN_FACTOR, keep_s: float | None = None) -> Option:
    """The better of: re-plan the unstarted work; also restart the restartable running tasks
    elsewhere. Nothing pinned ever moves. `keep_s`: `keep_makespan(s)` if already known."""
    keep = keep_makespan(s) if keep_s is None else keep_s
    best = _option(s, frozenset(), keep)
    # A running task whose consumer is already reported started or done has in fact finished
    # (its end event is late): restarting it is pointless, and would leave the consumer fixed
    # on an input that is not.
    seen = s.done.keys() | s.running.keys()
    restart = frozenset(
        t for t in s.restartable
        if t not in s.pinned
        and not any(s.graph.ids[j] in seen for j, _ in s.graph.succs[s.graph.index[t]])
    )  # fmt: skip
    if restart:
        try:
            alt = _option(s, restart, keep)
        except Unschedulable:  # nowhere else it may run (pinned to its agent, say)
            return best
        if alt.moved and (not best.moved or alt.net(factor) > best.net(factor)):
            best = alt
    return best


def decide(
    pipeline_id: str,
    trigger: str,
    s: Situation,
    factor: float = GAIN_FACTOR,
    keep_s: float | None = None,
) -> Decision:
    keep = keep_makespan(s) if keep_s is None else keep_s
    if cannot_pay(s, keep, factor):
        most = most_to_gain(s, keep)
        return Decision(
            pipeline_id, trigger, 0.0, 0.0, False, (), keep, keep,
            f"not priced: at most {most:.3f}s left to gain, a move costs at least "
            f"{s.overhead_s:.3f}s", factor,
        )  # fmt: skip
    opt = evaluate(s, factor, keep)
    if not opt.moved:
        return Decision(
            pipeline_id, trigger, opt.gain_s, 0.0, False, (), opt.keep_s, opt.replan_s,
            "a re-plan moves nothing", factor,
        )  # fmt: skip
    ok = worth_moving(opt.gain_s, opt.cost_s, factor)
    return Decision(
        pipeline_id, trigger, opt.gain_s, opt.cost_s, ok, tuple(sorted(opt.moved)), opt.keep_s,
        opt.replan_s, "", factor,
    )  # fmt: skip


# -- the shell ------------------------------------------------------------------------------------
@dataclass
class Trigger:
    kind: str
    detail: str
    #: Device -> how much slower than when the plan was made (running work's projection).
    than_planned: dict[str, float]
    #: Device -> its new measured GFLOP/s (the model is corrected to it if it lags behind).
    speeds: dict[str, float] = field(default_factory=dict)
    #: A late task: its projected remaining time overrides the model's.
    late_task: str | None = None


@dataclass(frozen=True)
class _Model:
    """A pipeline's cluster and costs at one moment (both clocks), for pricing it."""

    mono: float
    wall: float
    cluster: Cluster
    cost: SpecCostModel
    devices: dict[str, DeviceSpec]


class Adaptive:
    def __init__(
        self,
        orch: AdaptiveDoor,
        *,
        late_threshold: float = LATE_THRESHOLD,
        drift_threshold: float = DRIFT_THRESHOLD,
        factor: float = GAIN_FACTOR,
        overhead_s: float = MOVE_OVERHEAD_S,
        give_turn: Callable[[], Awaitable[None]] = one_turn,
    ) -> None:
        self.o = orch
        self.late_threshold, self.drift_threshold = late_threshold, drift_threshold
        self.factor, self.overhead_s = factor, overhead_s
        #: Awaited between the steps of a pricing, so that placements waiting on a reply go
        #: on meanwhile (whatever runs then may change the pipeline being priced).
        self.give_turn = give_turn
        self.decisions: list[Decision] = []
        self._timers: dict[tuple[str, str, int], asyncio.TimerHandle] = {}
        self._speeds: dict[str, float] = {}
        #: pipeline -> when (mono) a late task of it was last priced
        self._priced_late: dict[str, float] = {}
        #: Decisions are taken one at a time (they take milliseconds; moves go through the
        #: placement loop, itself serialised per replica).
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        nc = self.o.nc
        assert nc is not None
        # task events, adverts and evictions reach us through the orchestrator's own handlers
        # (decoded once, one subscription each); drift notices only matter here
        await nc.subscribe(subjects.ALL_DRIFT, cb=self._on_drift)

    def stop(self) -> None:
        for h in self._timers.values():
            h.cancel()
        self._timers.clear()

    # -- triggers ---------------------------------------------------------------------------------
    def task_event(self, ev: TaskEvent) -> None:
        """A live task event: a started task gets a lateness timer, any other state ends it."""
        key = (ev.pipeline_id, ev.task_id, ev.token)
        if ev.state != "started":
            h = self._timers.pop(key, None)
            if h is not None:
                h.cancel()
            return
        run = self.o.pipelines.get(ev.pipeline_id)
        tr = run.tasks.get(ev.task_id) if run is not None else None
        if tr is None or tr.token != ev.token or not tr.predicted_s or key in self._timers:
            return
        # a start is reported a while into the run (`started_event_after_s`), saying how long
        delay = max(0.0, self._due(tr.predicted_s) - (ev.duration_s or 0.0))
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._late, key)

    def _due(self, predicted_s: float) -> float:
        """Elapsed time after which a task is late: the relative threshold, with a floor."""
        return max(predicted_s * (1.0 + self.late_threshold), predicted_s + LATE_FLOOR_S)

    def _late(self, key: tuple[str, str, int]) -> None:
        self._timers.pop(key, None)
        pid, tid, token = key
        run = self.o.pipelines.get(pid)
        if run is None or run.terminal:
            return
        tr = run.tasks[tid]
        if tr.state != "started" or tr.token != token or not tr.predicted_s or not tr.device_id:
            return
        elapsed = self._elapsed(run, tid)
        due = self._due(tr.predicted_s)
        if elapsed <= due:  # our clock started a little before the run's: look again then
            loop = asyncio.get_running_loop()
            self._timers[key] = loop.call_later(due - elapsed + 1e-3, self._late, key)
            return
        mono = self.o.mono()
        last = self._priced_late.get(pid)
        if last is not None and mono - last < LATE_GAP_S:
            loop = asyncio.get_running_loop()
            self._timers[key] = loop.call_later(last + LATE_GAP_S - mono, self._late, key)
            return
        if len(self._priced_late) >= 4096:  # forget pipelines that ended
            self._priced_late = {
                p: t for p, t in self._priced_late.items()
                if (r := self.o.pipelines.get(p)) is not None and not r.terminal
            }  # fmt: skip
        self._priced_late[pid] = mono
        dev = f"{tr.agent_id}:{tr.device_id}"
        ratio = elapsed / tr.predicted_s
        trig = Trigger(
            "late",
            f"{tid}@{dev} {elapsed:.2f}s vs {tr.predicted_s:.2f}s predicted",
            {dev: ratio},
            late_task=tid,
        )
        self.o.spawn(self.consider(run, trig))
        # looked at again while it runs on (its end event drops the timer)
        again = max(LATE_GAP_S, elapsed * (LATE_REGROW - 1.0))
        self._timers[key] = asyncio.get_running_loop().call_later(again, self._late, key)

    async def _on_drift(self, msg: Msg) -> None:
        try:
            note = decode(msg.data, CalibrationDrift)
        except DecodeError:
            return
        if msg.subject != subjects.drift(note.agent_id):
            return
        key = f"{note.agent_id}:{note.device_id}"
        if self._speeds.get(key) != note.current:  # not seen in an advert already
            self._speeds[key] = note.current
            self._dropped(key, note.previous, note.current, "drift notice")

    def advert(self, adv: AgentAdvert) -> None:
        """An agent's advert (checked by the orchestrator): note speed drops per device."""
        for d in adv.devices:
            key = f"{adv.agent_id}:{d.device_id}"
            before = self._speeds.get(key)
            self._speeds[key] = d.gflops
            if before is not None and before != d.gflops:
                self._dropped(key, before, d.gflops, "advert")

    def _dropped(self, dev: str, before: float, after: float, source: str) -> None:
        """A device got slower: price a re-plan for every pipeline with work left on it."""
        if not speed_dropped(before, after, self.drift_threshold):
            return
        detail = f"{dev} {before:g}->{after:g} GFLOP/s, {source}"
        for run in list(self.o.pipelines.values()):
            if not run.terminal and any(
                f"{tr.agent_id}:{tr.device_id}" == dev and tr.state != "succeeded"
                for tr in run.tasks.values()
            ):
                trig = Trigger("drift", detail, {dev: before / after}, {dev: after})
                self.o.spawn(self.consider(run, trig))

    def evicted(self, note: EvictNotice) -> None:
        if note.pipeline_id in self.o.pipelines:
            log.info(
                "adaptive: trigger=priority(%s by %s) decision=preempt "
                "(handled by the eviction path)",
                note.device,
                note.by_pipeline,
            )

    # -- deciding and acting ----------------------------------------------------------------------
    def _elapsed(self, run: PipelineRun, tid: str) -> float:
        tr = run.tasks[tid]
        if run.committed_at is None or tr.started_s is None:
            return 0.0
        return max(0.0, self.o.mono() - run.committed_at - tr.started_s)

    def _model(self, run: PipelineRun) -> _Model | None:
        """This moment's cluster (with other pipelines' reservations) and costs for `run`;
        None when a device of it is gone (that is recovery's business, not adaptation's)."""
        o = self.o
        if run.committed_at is None or not run.placements:
            return None
        mono, wall = o.mono(), o.wall()
        cluster, links = o.view.snapshot(mono)
        if set(run.placements) != set(run.tasks) or any(
            p.device_id not in cluster for p in run.placements.values()
        ):
            return None
        devices = o.view.device_specs(cluster)
        cluster = with_bookings(
            cluster, o.store.snapshot(), run.t0, Blocking(run.pipeline_id), wall
        )
        tiers = {d.id: d.tier for d in cluster.devices}
        cost = SpecCostModel(
            run.spec, devices, links, o.predictor, tiers,
            **store_costs(run.reads, o.view, cluster), warm=warm_models(o.view, run.spec),
        )  # fmt: skip
        return _Model(mono, wall, cluster, cost, devices)

    def situation(
        self, run: PipelineRun, trig: Trigger, model: _Model | None = None
    ) -> Situation | None:
        """The pipeline on the scheduler's model (None when a device of it is gone). `model`:
        one made a moment ago for the same pipeline (pricing one moment under two triggers
        builds the cluster, the reservations and the cost estimates once)."""
        m = model or self._model(run)
        if m is None or run.committed_at is None:
            return None
        mono, wall, cluster, cost, devices = m.mono, m.wall, m.cluster, m.cost, m.devices
        now = max(0.0, wall - run.t0)
        since_commit = mono - run.committed_at  # seconds on the run's own clock
        done: dict[str, Placement] = {}
        running: dict[str, Placement] = {}
        elapsed: dict[str, float] = {}
        for tid, tr in run.tasks.items():
            p = run.placements[tid]
            if tr.state == "succeeded" and tr.started_s is not None and tr.finished_s is not None:
                start = now - (since_commit - tr.started_s)
                end = max(start, now - (since_commit - tr.finished_s))
                done[tid] = Placement(tid, p.device_id, p.slot, start, end)
            elif tr.state == "started" and tr.started_s is not None:
                ran = max(0.0, since_commit - tr.started_s)
                predicted = tr.predicted_s or (p.finish - p.start)
                if tid == trig.late_task:
                    left = max(ran - predicted, 0.0)  # the overrun so far, once more
                else:
                    left = max(predicted * trig.than_planned.get(p.device_id, 1.0) - ran, 0.0)
                running[tid] = Placement(tid, p.device_id, p.slot, now - ran, now + left)
                elapsed[tid] = ran
        # Events from different agents arrive in any order: a consumer may be reported
        # started before its producer is reported finished. It had its inputs, so every task
        # upstream of one started or done has finished: done, by the consumer's start at latest.
        seen = set(done) | set(running)
        upstream = [d for t in seen for d in run.spec_by_id[t].deps if d not in seen]
        while upstream:
            d = upstream.pop()
            if d in seen:
                continue
            seen.add(d)
            upstream.extend(x for x in run.spec_by_id[d].deps if x not in seen)
            starts = [q.start for c in run.children[d] if (q := done.get(c) or running.get(c))]
            end = min(starts, default=now)
            p = run.placements[d]
            done[d] = Placement(d, p.device_id, p.slot, end, end)
        # the planning model reads the cluster view: correct it where it lags behind
        slower: dict[str, float] = {}
        for dev, after in trig.speeds.items():
            modelled = devices[dev].gflops if dev in devices else after
            slower[dev] = max(1.0, modelled / after)
        if trig.late_task is not None:  # nothing but the overrun says the device is slow
            slower.update(trig.than_planned)

        # Never moved: non-migratable tasks, and tasks whose inputs were already shipped to
        # their device or may be while the move is carried out: a producer that succeeded, or
        # one projected to finish within MOVE_RACE_S (running, or queued to start that soon).
        # Agents drop an output once its consumer has it, so a push to the old place mid-move
        # would strand the moved task. A running task may restart elsewhere only if it has no
        # inputs to lose.
        def finishes_soon(d: str) -> bool:
            if run.tasks[d].state == "succeeded":
                return True
            p = running.get(d) or run.placements.get(d)
            return p is None or p.finish - now < MOVE_RACE_S

        shipped = {
            t.id for t in run.spec.tasks
            if t.id not in running and t.id not in done and any(map(finishes_soon, t.deps))
        }  # fmt: skip
        pinned = frozenset(t.id for t in run.spec.tasks if not t.migratable) | shipped
        restartable = frozenset(
            t
            for t, p in running.items()
            if p.device_id in trig.than_planned and not run.spec_by_id[t].deps
        )
        return Situation(
            to_graph(run.spec, run.measured_bytes()), cluster, cost, dict(run.placements), done,
            running, elapsed, now, slower, pinned, restartable, self.overhead_s,
        )  # fmt: skip

    async def consider(self, run: PipelineRun, trig: Trigger) -> Decision | None:
        pid = run.pipeline_id
        async with self._lock:
            if run.terminal or self.o.pipelines.get(pid) is not run:
                return None
            if not self.o.failover.may_act(pid):
                return None
            try:
                model = self._model(run)
                s = self.situation(run, trig, model)
                if s is None or model is None:
                    return None
                # pricing is a few plans' worth of CPU in one go (3-4 ms on the 2-core
                # reference machine): placements waiting on a reply get turns between steps
                if not await self._turn(run):
                    return None
                keep = keep_makespan(s)
                if (
                    trig.late_task is not None
                    and not cannot_pay(s, keep, self.factor)
                    and not self._critical(run, trig, model, keep)
                ):
                    log.debug("adaptive: %s is late but off the critical path", trig.detail)
                    return None
                if not await self._turn(run):
                    return None
                d = decide(pid, f"{trig.kind}({trig.detail})", s, self.factor, keep)
            except Exception as exc:
                log.warning("adaptive: pricing %s for %s failed: %s", trig.kind, pid, exc)
                return None
            self.decisions.append(d)
            del self.decisions[:-1000]
            log.info("pipeline=%s %s", pid, d.line())
            run.note(d.line())
            if d.replan:
                await self._move(run, s, d)
                await self.o.persist(run)
            # a decision to keep the plan changes nothing a new owner needs: its log line
            # reaches the record with the pipeline's next write (under load, late tasks are
            # priced often; a record write for each was CPU spent on nothing)
        await self.o.notify_changed()
        return d

    async def _turn(self, run: PipelineRun) -> bool:
        """A turn of the event loop (`give_turn`); whether `run` is still ours to price after
        it."""
        await self.give_turn()
        pid, o = run.pipeline_id, self.o
        return not run.terminal and o.pipelines.get(pid) is run and o.failover.may_act(pid)

    def _critical(self, run: PipelineRun, trig: Trigger, model: _Model, keep_s: float) -> bool:
        """Does the late task's overrun (`keep_s`: the end it projects) push the pipeline's
        end out at all?"""
        on_time = self.situation(run, Trigger(trig.kind, trig.detail, {}), model)
        return on_time is None or keep_s > keep_makespan(on_time) + 1e-6

    async def _move(self, run: PipelineRun, s: Situation, d: Decision) -> None:
        """Carry the decision out through the placement loop: the moved tasks and everything
        downstream of them not yet started, each held to the device the decision chose."""
        o = self.o
        opt = evaluate(s, self.factor)
        todo = {t for t in descendants(run, opt.moved) if run.tasks[t].state != "succeeded"}
        todo -= {t for t in todo if t in s.running and t not in opt.moved}
        # Never beside another re-placement of the pipeline (an eviction's, a recovery's):
        # two would plan, offer and withdraw the same tasks over each other's records. One
        # under way re-plans these tasks itself; and one that ran while this was priced
        # (between its turns) leaves a decision made on placements that are gone.
        lock = o.recovery.lock(run.pipeline_id)
        if lock.locked():
            run.note("adaptive: not moved: another re-placement of the pipeline is under way")
            return
        async with lock:  # free: taken without a turn of the loop in between
            changed = sorted(
                t for t in todo
                if run.placements.get(t) != s.current.get(t)
                or run.tasks[t].state not in (
                    ("started",) if t in s.running else ("offered", "accepted")
                )
            )  # fmt: skip
            if changed:
                run.note(f"adaptive: not moved: {', '.join(changed)} changed while priced")
                return
            await self._move_now(run, s, opt, todo)

    async def _move_now(self, run: PipelineRun, s: Situation, opt: Option, todo: set[str]) -> None:
        o = self.o
        target = {t: (opt.moved.get(t) or s.current[t]).device_id for t in todo}
        exclude = {(t, dev.id) for t in todo for dev in s.cluster.devices if dev.id != target[t]}
        old = {t: run.placements[t] for t in todo}
        try:
            await o.placer.place(run, only=todo, exclude=exclude)
        except PlacementFailed as exc:
            run.note(f"adaptive: re-placing {', '.join(sorted(todo))} failed: {exc}")
            return
        away = {t: p for t, p in old.items() if run.placements[t].device_id != p.device_id}
        gone = {
            t: p for t, p in away.items() if p.device_id.split(":", 1)[0] != run.tasks[t].agent_id
        }  # fmt: skip
        await o.cancel_tasks(run, gone, "moved by adaptive re-scheduling")
        now = o.wall()
        for dev in sorted({p.device_id for p in away.values()}):
            tids = [t for t, p in away.items() if p.device_id == dev]
            with contextlib.suppress(Exception):
                await o.store.release(device_key_of(dev), run.pipeline_id, now, tids)
        await o.commits.commit_all(run, todo)
        await o.displaced.reroute_producers(run, away)
        run.note(f"adaptive: moved {', '.join(sorted(away)) or 'nothing'}")
