"""A portfolio of list schedulers: run several, keep the best plan by the user's objective.

No single heuristic wins everywhere (HEFT, CPOP and PEFT each win on some graph shapes and
communication ratios), and running a few more costs milliseconds. HEFT always runs first, so
the result is never worse than HEFT by the objective (on the same, possibly pre-filtered,
cluster); the others follow in a fixed order and a later plan replaces the best only when
strictly better, so ties go to the earlier candidate.

Determinism: which candidates run depends on the problem size, the budget and this process's
loop speed, never on the clock during a call. One HEFT run is estimated as (a x tasks + b x
edges + c x (tasks + edges) x devices) times the process's loop scale, which
`calibration.loop_scale` measures once, on first use, by timing HEFT on a fixed problem
(rounded to a quarter power of two, so one machine mostly gets one scale; clusters past the
dense loops get a scale of their own; `set_loop_scale` fixes them). Each candidate costs a
constant factor times that, the factor measured offline for the loop in use (compiled or
Python: their ratios differ, PEFT 15-37x HEFT compiled but ~3x in Python). A candidate runs when
the estimates of everything run so far plus its own fit in `budget_s`, otherwise it is skipped
(a later, cheaper one may still fit). HEFT runs even when it alone is over budget, and so do
the cost-aware candidates when the objective weighs money (a few HEFT-priced runs: a plan asked
to weigh money is ranked by it however busy the planner). So within a process the same graph
and budget give the same plan; time enters only through the budget and the one calibration.

Safety net: if the wall clock ever passes `GUARD_FACTOR` x budget_s + `GUARD_SLACK_S` (the
estimates wildly wrong, a machine many times slower than the calibration), the remaining
candidates are skipped. On typical sizes and hardware it never triggers, so in practice the
same input gives the same plan; it exists so a portfolio call cannot run away.

The returned plan's `algorithm` is "portfolio:<winner>" and its `cost` holds its dollars
(`plan_cost`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from orchestrator.scheduling import calibration, compiled
from orchestrator.scheduling.constraints import Unschedulable
from orchestrator.scheduling.cost import CostModel
from orchestrator.scheduling.cpop import cpop_prepared
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.heft import heft_prepared
from orchestrator.scheduling.iterative import iterative_heft_prepared
from orchestrator.scheduling.lookahead import lookahead_prepared
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.money import Objective, cost_aware_prepared, plan_cost
from orchestrator.scheduling.peft import peft_prepared
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.prefilter import prefilter_cluster

# Pre-filtering: per device and per (task x device) of the full cluster.
T_PREFILTER_DEVICE = 4e-7
T_PREFILTER_CELL = 1e-8
GUARD_FACTOR = 10.0
GUARD_SLACK_S = 0.5
# Seconds per dollar used when time has no weight at all (money decides, time breaks ties).
MONEY_ONLY_WEIGHT = 1e9

Runner = Callable[[Prepared], Plan]
#: Size (tasks) up to which candidates' factors were measured as constants.
GROWTH_FROM = 200


@dataclass(frozen=True, slots=True)
class Candidate:
    """One algorithm the portfolio may run; `weight` is its cost relative to one HEFT run on
    the Python loop, `weight_jit` on the compiled loop (measured at 100-600 tasks, the
    larger of the ratios seen)."""

    name: str
    run: Runner
    weight: float
    weight_jit: float
    #: the factor grows as (tasks / GROWTH_FROM) ** growth above that size (look-ahead's does:
    #: it tries each task's children on every device)
    growth: float = 0.0

    def factor(self, tasks: int = 0) -> float:
        """Its cost relative to one HEFT run on the loop this process uses, for `tasks`."""
        base = self.weight_jit if compiled.runner() is not None else self.weight
        if self.growth and tasks > GROWTH_FROM:
            base *= (tasks / GROWTH_FROM) ** self.growth
        return base


def heft_estimate(prep: Prepared) -> float:
    """Estimated seconds for one HEFT run on `prep` on this process's loop (used only to
    decide what fits; the first call measures the loop, `calibration.loop_scale`)."""
    n, e, m = len(prep.todo), len(prep.graph.edges), len(prep.cluster)
    return calibration.estimate(n, e, m, prep.cluster.n_slots)


def devices_reversed(prep: Prepared) -> Plan:
    """HEFT with ties between devices going to the last one listed instead of the first (the
    same devices, in reverse order): on clusters of identical devices the choice shapes where
    later tasks find room."""
    flipped = Prepared(
        prep.graph, Cluster(prep.cluster.devices[::-1]), prep.cost, prep.fixed, prep.now
    )
    return replace(heft_prepared(flipped), algorithm="heft-ties-lastdev")


def self_pairs(prep: Prepared) -> float:
    """Scale of the mean transfer time when the average also counts each device paired with
    itself (zero cost) over unordered pairs, as some HEFT implementations compute it."""
    m = len(prep.cluster)
    return (m - 1) / (m + 1) if m > 1 else 1.0


TIME_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("peft", peft_prepared, 3.0, 37.0),
    Candidate("cpop", cpop_prepared, 2.2, 29.0),
    Candidate("heft-selfpairs", lambda p: heft_prepared(p, comm=self_pairs(p)), 1.1, 1.6),
    Candidate(
        "cpop-selfpairs-harmonic",
        lambda p: cpop_prepared(p, self_pairs(p), rank="harmonic"),
        2.2,
        29.0,
    ),
    Candidate("cpop-selfpairs-own", lambda p: cpop_prepared(p, self_pairs(p), own=True), 2.3, 28.0),
    Candidate("heft-rank-best", lambda p: heft_prepared(p, rank="best"), 1.1, 1.6),
    Candidate("heft-rank-median", lambda p: heft_prepared(p, rank="median"), 1.15, 1.9),
    Candidate("heft-comm0.5", lambda p: heft_prepared(p, comm=0.5), 1.1, 1.5),
    Candidate("heft-comm2", lambda p: heft_prepared(p, comm=2.0), 1.1, 1.6),
    Candidate("heft-comm0", lambda p: heft_prepared(p, comm=0.0), 1.1, 1.5),
    Candidate("heft-comm0.75", lambda p: heft_prepared(p, comm=0.75), 1.1, 1.4),
    Candidate("cpop-comm0.75", lambda p: cpop_prepared(p, 0.75), 2.2, 28.0),
    Candidate("heft-rank-harmonic", lambda p: heft_prepared(p, rank="harmonic"), 1.15, 1.9),
    Candidate("cpop-rank-harmonic", lambda p: cpop_prepared(p, rank="harmonic"), 2.2, 29.0),
    Candidate("cpop-comm0.5", lambda p: cpop_prepared(p, 0.5), 2.2, 29.0),
    Candidate("heft-comm1.5", lambda p: heft_prepared(p, comm=1.5), 1.1, 1.8),
    Candidate("heft-comm0.25", lambda p: heft_prepared(p, comm=0.25), 1.1, 1.5),
    Candidate("heft-ties-late", lambda p: heft_prepared(p, ties="late"), 1.1, 1.6),
    Candidate("heft-ties-work", lambda p: heft_prepared(p, ties="work"), 1.1, 1.8),
    Candidate("heft-ties-lastdev", devices_reversed, 1.5, 4.0),
    Candidate("heft-iter", iterative_heft_prepared, 3.5, 8.0),
    Candidate("heft-noins", lambda p: heft_prepared(p, insertion=False), 0.85, 0.9),
    Candidate("heft-lookahead", lookahead_prepared, 10.5, 140.0, growth=0.65),
)


def _money(name: str, weight: float) -> Candidate:
    return Candidate(name, lambda p: cost_aware_prepared(p, weight, name), 1.4, 1.8)


def money_candidates(objective: Objective, makespan: float, dollars: float) -> list[Candidate]:
    """Cost-aware HEFT at a few exchange rates, from HEFT's own (makespan, dollars)."""
    if not objective.uses_money or dollars <= 0:
        return []
    if objective.budget is None:
        tw = objective.time_weight
        rate = objective.money_weight / tw if tw > 0 else MONEY_ONLY_WEIGHT
        rates = [rate, rate * 8, rate / 8]
    else:  # sweep from "a dollar is worth HEFT's seconds per dollar" towards money only
        base = makespan / dollars if makespan > 0 else 1.0
        rates = [base * f for f in (1.0, 4.0, 16.0, 64.0, 1024.0, 1e6)]
    return [_money(f"heft-money@{r:.3g}", r) for r in rates]


def _prepare(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    fixed: Mapping[str, Placement] | None,
    now: float,
    prefilter: int | None,
) -> tuple[Prepared, float]:
    """The shared request (on the pre-filtered cluster when asked) and its estimated cost."""
    if prefilter is None or prefilter >= len(cluster):
        return Prepared(graph, cluster, cost, fixed, now), 0.0
    spent = (T_PREFILTER_DEVICE + T_PREFILTER_CELL * len(graph)) * len(cluster)
    small = prefilter_cluster(graph, cluster, cost, prefilter, fixed=fixed, now=now)
    try:
        return Prepared(graph, small, cost, fixed, now), spent
    except Unschedulable:  # reasons must name every device: ask the full cluster
        return Prepared(graph, cluster, cost, fixed, now), spent


def portfolio(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    objective: Objective | None = None,
    budget_s: float = 0.05,
    prefilter: int | None = None,
    max_share: float | None = None,
) -> Plan:
    """The best plan by `objective` (default: makespan) among the candidates that fit in
    `budget_s` seconds by estimate; with `prefilter`, plan on about that many devices
    (`prefilter_cluster`). Constraints, fixed placements and errors as `heft`.

    Time beyond HEFT is spent only where it can pay: none when HEFT's plan already finishes
    at the critical-path bound (makespan objective), and with `max_share` at most that share
    of HEFT's makespan (planning time delays a new pipeline's end as much as a longer plan)."""
    if not budget_s >= 0:
        raise ValueError(f"budget_s must be >= 0, got {budget_s}")
    if max_share is not None and not max_share >= 0:
        raise ValueError(f"max_share must be >= 0, got {max_share}")
    objective = objective or Objective()
    compiled.warm_up()  # a first call would otherwise spend the budget loading the kernel
    calibration.loop_scale()  # measured once per process, before the clock starts
    if calibration.is_wide(len(graph), len(cluster), cluster.n_slots):
        calibration.wide_scale()
    started = time.perf_counter()
    deadline = started + GUARD_FACTOR * budget_s + GUARD_SLACK_S
    prep, spent = _prepare(graph, cluster, cost, fixed, now, prefilter)
    unit = heft_estimate(prep)
    spent += unit

    def dollars(plan: Plan) -> float:
        return plan_cost(plan, prep.graph, prep.cluster, prep.cost)

    best = heft_prepared(prep)
    best_cost = dollars(best) if objective.uses_money else 0.0
    best_key = objective.key(best.makespan, best_cost)
    if not objective.uses_money and best.makespan <= prep.critical_path_bound() * (1 + 1e-9):
        extra_budget = 0.0  # HEFT reached the bound: no candidate can finish sooner
    else:
        extra_budget = budget_s if max_share is None else min(budget_s, max_share * best.makespan)
    money = money_candidates(objective, best.makespan, best_cost)
    for cand in [*money, *TIME_CANDIDATES]:
        est = unit * cand.factor(len(prep.todo))
        # the cost-aware candidates run whatever the budget, as HEFT does: without them a
        # plan asked to weigh money would be ranked by it only when the planner had time
        required = cand in money
        if not required and spent + est > extra_budget:
            continue
        if not required and time.perf_counter() > deadline:
            break
        spent += est
        plan = cand.run(prep)
        plan_dollars = dollars(plan) if objective.uses_money else 0.0
        key = objective.key(plan.makespan, plan_dollars)
        if key < best_key:
            best, best_cost, best_key = plan, plan_dollars, key
    if not objective.uses_money:
        best_cost = dollars(best)
    return replace(best, algorithm=f"portfolio:{best.algorithm}", cost=best_cost)
