"""Turn a pipeline spec plus the live cluster into a scheduler problem, and plan it."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from orchestrator.placement.pricing import held_to, objective_of
from orchestrator.placement.registry import ClusterView
from orchestrator.predictor.model import Estimates, Predictor
from orchestrator.reservations.book import Blocking
from orchestrator.reservations.store import Cached, device_key_of
from orchestrator.scheduling import (
    Cluster,
    Device,
    Link,
    LinkCostModel,
    Placement,
    Plan,
    Task,
    TaskGraph,
    TransferTable,
    Unschedulable,
    portfolio,
)
from orchestrator.state.reads import StoreReads
from schemas.agent import DeviceSpec
from schemas.pipeline import OnnxRun, PipelineSpec, SyntheticRun, TaskSpec


def output_bytes(task: TaskSpec) -> int:
    """Bytes a task sends to each consumer: declared, else what a synthetic run emits."""
    if task.output_bytes:
        return task.output_bytes
    if isinstance(task.run, SyntheticRun):
        return task.run.output_bytes
    return 0


def to_graph(spec: PipelineSpec, measured: Mapping[str, int] | None = None) -> TaskGraph:
    """The scheduler's graph; each edge carries what the producer sends: its measured output
    size once it ran (`measured`), else what it declares."""
    tasks = [
        Task(
            id=t.id,
            work=1.0,
            kinds=frozenset(t.requires.kinds),
            tiers=frozenset(t.requires.tiers),
            min_memory_mb=t.requires.min_memory_mb,
            labels=dict(t.requires.labels),
            pinned=t.requires.pinned_agent,
        )
        for t in spec.tasks
    ]
    by_id = {t.id: t for t in spec.tasks}
    sent = {t.id: float(output_bytes(t)) for t in spec.tasks}
    if measured:
        sent.update((t, float(n)) for t, n in measured.items() if t in sent)
    edges = {(d, t.id): sent[d] for t in spec.tasks for d in t.deps if d in by_id}
    return TaskGraph(tasks, edges)


def store_sites(cluster: Cluster) -> frozenset[str]:
    """Where the object store is taken to be: the sites of the cloud tier (JetStream runs
    beside the orchestrator there), none when the cluster has no cloud agent."""
    return frozenset(d.site for d in cluster.devices if d.tier == "cloud")


#: The shortest time a plan gives a task on its slot: a reservation is never shorter
#: (`placement.MIN_WINDOW_S`), and a task planned shorter would let the plan start the next
#: one on that slot inside the reservation (a re-planned task then loses every round to its
#: own pipeline's window).
MIN_TASK_S = 1e-3

_DEFAULT_PREDICTOR: Predictor | None = None


def default_predictor() -> Predictor:
    """One process-wide predictor for callers that bring none (tools, tests)."""
    global _DEFAULT_PREDICTOR
    if _DEFAULT_PREDICTOR is None:
        _DEFAULT_PREDICTOR = Predictor()
    return _DEFAULT_PREDICTOR


class SpecCostModel:
    """Compute time from the predictor (learned model where it applies, prior elsewhere, times
    the online correction), scored for every task on every device in one batched call; links
    as measured. A task's time on a device includes fetching what it reads from the object
    store there (`reads`): its pipeline inputs, and its artifact unless the agent holds it
    (`held`: digests by agent), over the link from the nearest store site (`sites`; none
    known: the device's own site's LAN). Where `warm` says which devices' agents hold a
    session of each model (by model, as tasks name it), an ONNX task's time on a device
    without its model also includes the model's load (`Predictor.load_estimates`: the load
    reported there, else a prior); `warm` None: no load is charged anywhere."""

    def __init__(
        self,
        spec: PipelineSpec,
        devices: Mapping[str, DeviceSpec],
        links: Mapping[tuple[str, str], Link],
        predictor: Predictor | None = None,
        tiers: Mapping[str, str] | None = None,
        *,
        reads: StoreReads | None = None,
        held: Mapping[str, Collection[str]] | None = None,
        sites: Collection[str] = (),
        warm: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        self.specs = {t.id: t for t in spec.tasks}
        self.devices = devices
        self.links = LinkCostModel(links)
        self.predictor = predictor if predictor is not None else default_predictor()
        self.tiers = tiers or {}
        self._est: Estimates | None = None
        self._row = {t.id: i for i, t in enumerate(spec.tasks)}
        self._col = {d: j for j, d in enumerate(devices)}
        #: (task, device) pairs ruled out by an agent's rejection: infinite time, never chosen.
        self.excluded: set[tuple[str, str]] = set()
        self.reads = reads or StoreReads()
        self.held = held or {}
        self.sites = tuple(sorted(sites))
        self._store_link: dict[str, Link] = {}
        self.warm = warm
        #: Run time plus load, per (task, device), once computed (`times`).
        self._times: NDArray[np.float64] | None = None

    def store_link(self, site: str) -> Link:
        """The link a device at `site` fetches from the store over: the fastest from a store
        site (its own LAN when it is one, or none is known)."""
        link = self._store_link.get(site)
        if link is None:
            if not self.sites or site in self.sites:
                link = self.links.link(site, site)
            else:
                link = max(
                    (self.links.link(s, site) for s in self.sites),
                    key=lambda k: (k.bandwidth_Bps, -k.latency_s),
                )
            self._store_link[site] = link
        return link

    def fetch_time(self, task_id: str, device: Device) -> float:
        """Seconds to fetch what the task reads from the store before it runs on `device`."""
        nbytes = self.reads.inputs.get(task_id, 0)
        art = self.reads.artifacts.get(task_id)
        if art is not None and art[0] not in self.held.get(device.agent_id, ()):
            nbytes += art[1]
        if not nbytes:
            return 0.0
        link = self.store_link(device.site)
        return link.latency_s + nbytes / link.bandwidth_Bps

    @property
    def estimates(self) -> Estimates:
        """All tasks on all devices, computed once per cost model (none under MIN_TASK_S)."""
        if self._est is None:
            keys = list(self.devices)
            est = self.predictor.estimate(
                list(self.specs.values()),
                [self.devices[k] for k in keys],
                keys,
                [self.tiers.get(k, "") for k in keys],
            )
            self._est = replace(est, seconds=np.maximum(est.seconds, MIN_TASK_S))
        return self._est

    @property
    def times(self) -> NDArray[np.float64]:
        """Compute time per (task, device) before fetches: the estimate, plus the model's
        load where the device's agent holds no session of it (see the class)."""
        if self._times is None:
            sec = self.estimates.seconds
            load = self.loads()
            self._times = sec if load is None else sec + load
        return self._times

    def loads(self) -> NDArray[np.float64] | None:
        """The load charged per (task, device): 0 where the device's agent holds the task's
        model warm; None when nothing is charged anywhere (`warm` None, or no ONNX task)."""
        warm = self.warm
        if warm is None:
            return None
        specs = list(self.specs.values())
        rows: dict[str, list[int]] = {}  # the tasks of each model
        for i, t in enumerate(specs):
            if isinstance(t.run, OnnxRun):
                rows.setdefault(t.run.model, []).append(i)
        if not rows:
            return None
        art = self.reads.artifacts
        nbytes = [a[1] if (a := art.get(t.id)) else None for t in specs] if art else None
        out = self.predictor.load_estimates(specs, list(self.devices), nbytes)
        col = self._col
        for m, at in rows.items():
            hot = [j for k in warm.get(m, ()) if (j := col.get(k)) is not None]
            if not hot:  # (the devices holding it warm)
                continue
            if len(at) == 1:  # (a third of np.ix_'s time)
                out[at[0], hot] = 0.0
            else:
                out[np.ix_(at, hot)] = 0.0
        return out

    def estimate(self, task_id: str, device_id: str) -> tuple[float, str, float, float]:
        """(seconds, source, low, high) of one task on one device."""
        e, i, j = self.estimates, self._row[task_id], self._col[device_id]
        return float(e.seconds[i, j]), e.source_name(i, j), float(e.lo[i, j]), float(e.hi[i, j])

    def base(self, task_id: str, device_id: str) -> float | None:
        """The uncorrected estimate of one task on one device (None for an unknown device)."""
        j = self._col.get(device_id)
        return None if j is None else float(self.estimates.base[self._row[task_id], j])

    def compute_time(self, task: Task, device: Device) -> float:
        if (task.id, device.id) in self.excluded:
            return math.inf
        run = float(self.times[self._row[task.id], self._col[device.id]])
        return run + self.fetch_time(task.id, device) if self.reads else run

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float:
        return self.links.transfer_time(nbytes, src, dst)

    def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
        sec = self.times
        rows = [self._row[t.id] for t in tasks]
        cols = [self._col[d.id] for d in cluster.devices]
        out: NDArray[np.float64] = sec[np.ix_(rows, cols)]
        if self.reads:
            fetching = self.reads.inputs.keys() | self.reads.artifacts.keys()
            for i, t in enumerate(tasks):
                if t.id in fetching:
                    out[i] += [self.fetch_time(t.id, d) for d in cluster.devices]
        if self.excluded:
            col = {d.id: j for j, d in enumerate(cluster.devices)}
            row = {t.id: i for i, t in enumerate(tasks)}
            for tid, dev in self.excluded:
                if tid in row and dev in col:
                    out[row[tid], col[dev]] = math.inf
        return out

    def transfer_table(self, cluster: Cluster) -> TransferTable:
        return self.links.transfer_table(cluster)


def store_costs(reads: StoreReads | None, view: ClusterView, cluster: Cluster) -> dict[str, Any]:
    """SpecCostModel's keywords for the store fetches of `reads` on `cluster`."""
    if not reads:
        return {}
    held = (
        {aid: frozenset(e.advert.artifacts) for aid, e in view.agents.items()}
        if reads.artifacts
        else {}
    )
    return {"reads": reads, "held": held, "sites": store_sites(cluster)}


def warm_models(view: ClusterView, spec: PipelineSpec) -> Mapping[str, Collection[str]] | None:
    """SpecCostModel's `warm` for `spec`: the devices whose agent advertises a session of
    each model (`ClusterView.warm_models`). None, charging no load, when `spec` has no ONNX
    task (nothing to look up)."""
    if not any(isinstance(t.run, OnnxRun) for t in spec.tasks):
        return None
    return view.warm_models()


@dataclass(frozen=True)
class Planned:
    plan: Plan
    graph: TaskGraph
    cluster: Cluster
    cost: SpecCostModel


#: Planning budget per request: HEFT always, more candidates when they fit.
PLAN_BUDGET_S = 0.002
#: ... and never more than this share of HEFT's makespan: planning time delays a new
#: pipeline's end as surely as a longer plan does, and the other candidates rarely beat HEFT
#: by more (on the placement benchmark's 20-task pipelines on 100 idle agents: in 0 of 200).
PLAN_MAX_SHARE = 0.02


def with_bookings(
    cluster: Cluster,
    bookings: Mapping[str, Cached],
    t0: float,
    blocks: Blocking,
    now: float,
) -> Cluster:
    """The cluster with the live reservations `blocks` keeps (other pipelines', and the
    planning pipeline's own of tasks it does not place) as per-slot
    busy windows, in seconds relative to `t0` on the booking clock; expired ones are ignored
    (whoever writes the key next drops them). Runs on every plan over every booked window,
    so it reads each key's windows as plain tuples."""
    overlay: dict[int, tuple[tuple[int, float, float], ...]] = {}
    own, kept = blocks.pipeline_id, blocks.kept
    for i, d in enumerate(cluster.devices):
        cached = bookings.get(device_key_of(d.id))
        if cached is None:
            continue
        # A window still in the bucket is work not yet known finished: if its planned end has
        # passed it is still queued or running, so it holds its slot from now for its planned
        # duration (released windows are gone; expired ones ignored).
        extra = [
            (slot, s, max(s, max(end, now + (end - start)) - t0))  # never ends before it starts
            for slot, start, end, expires, pid, pre, prio, sub, evs, tid in cached.rows()
            if expires > now and slot < d.slots and (pid != own or tid in kept)
            and not (pre and blocks.evicts(pre, prio, sub, evs))
            for s in (max(0.0, start - t0),)
        ]  # fmt: skip
        if extra:
            overlay[i] = tuple(extra)
    # valid by construction: slots below the device's, finite instants (the schema's), s <= e
    return cluster.with_slot_busy(overlay, check=False) if overlay else cluster


def plan_pipeline(
    spec: PipelineSpec,
    view: ClusterView,
    now: float,
    *,
    bookings: Mapping[str, Cached] | None = None,
    t0: float = 0.0,
    blocks: Blocking | None = None,
    excluded: set[tuple[str, str]] | None = None,
    fixed: Mapping[str, Placement] | None = None,
    rel_now: float = 0.0,
    budget_s: float = PLAN_BUDGET_S,
    predictor: Predictor | None = None,
    max_share: float | None = PLAN_MAX_SHARE,
    measured: Mapping[str, int] | None = None,
    reads: StoreReads | None = None,
    refuse_over_budget: bool = False,
) -> Planned:
    """Plan on the live view (and the cached reservations); raises scheduling.Unschedulable
    with per-device reasons. Times in the plan are seconds after `t0`. `measured`: the
    output sizes of tasks that ran; `reads`: what tasks fetch from the object store.

    Plans are ranked by the spec's objective (`pricing.objective_of`: its budget and money
    weight) and priced (`plan.cost`, dollars). No plan within the budget: the cheapest
    found, or with `refuse_over_budget` (a first placement) `pricing.OverBudget`."""
    cluster, links = view.snapshot(now)
    if not len(cluster):
        raise Unschedulable({t.id: {} for t in spec.tasks})  # says: the cluster has no devices
    devices = view.device_specs(cluster)
    if bookings:
        cluster = with_bookings(cluster, bookings, t0, blocks or Blocking(), t0 + rel_now)
    graph = to_graph(spec, measured)
    tiers = {d.id: d.tier for d in cluster.devices}
    cost = SpecCostModel(
        spec, devices, links, predictor, tiers, **store_costs(reads, view, cluster),
        warm=warm_models(view, spec),
    )  # fmt: skip
    if excluded:
        cost.excluded = set(excluded)
    live_fixed = {t: p for t, p in (fixed or {}).items() if p.device_id in cluster}
    # The core needs fixed tasks closed under predecessors. A task held fixed (running or done)
    # whose producer is gone with a dead device, or is being re-run, is planned again here as
    # a stand-in: the caller keeps its real placement and neither books nor offers it.
    deps = {t.id: t.deps for t in spec.tasks}
    while drop := [t for t in live_fixed if any(d not in live_fixed for d in deps[t])]:
        for t in drop:
            del live_fixed[t]
    objective = objective_of(spec)
    plan = portfolio(
        graph, cluster, cost, fixed=live_fixed, now=rel_now, budget_s=budget_s,
        max_share=max_share, objective=objective,
    )  # fmt: skip
    plan = held_to(
        plan, objective, graph, cluster, cost, fixed=live_fixed, now=rel_now,
        refuse=refuse_over_budget,
    )  # fmt: skip
    return Planned(plan, graph, cluster, cost)
