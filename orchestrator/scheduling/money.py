"""What a plan costs in dollars, how to weigh dollars against seconds, and a HEFT that does.

A plan pays for device time (each device's $/hour over the time its tasks run, idle time is
free) and for data crossing sites (each edge whose ends sit in different sites pays bytes/1e9
x the link's $/GB; only a LinkCostModel knows link prices, or a model that keeps one as its
`links` (the orchestrator's), other models make transfers free).

`Objective` turns (makespan, dollars) into a sort key the portfolio minimises; `money_weight`
is in seconds per dollar, the exchange rate at which a user trades time for money. With a
budget, any plan within it beats any plan over it.

`cost_aware_heft` is HEFT whose device choice minimises finish + money_weight x the dollars
the placement adds (its device time plus its inputs' cross-site transfers): the portfolio's
way to find cheaper plans when money matters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.cost import CostModel, LinkCostModel
from orchestrator.scheduling.engine import Choice, ListScheduler, Prepared
from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan
from orchestrator.scheduling.ranks import priority_keys

GB = 1e9


def priced_links(cost: CostModel) -> LinkCostModel | None:
    """The link table whose $/GB a plan pays: the model itself, or the LinkCostModel it keeps
    as `links` (a model that adds predictions to measured links); None: transfers are free."""
    if isinstance(cost, LinkCostModel):
        return cost
    links = getattr(cost, "links", None)
    return links if isinstance(links, LinkCostModel) else None


def plan_cost(plan: Plan, graph: TaskGraph, cluster: Cluster, cost: CostModel) -> float:
    """Dollars: device time at each device's $/hour plus cross-site bytes at $/GB."""
    devices = cluster.devices
    index = cluster.index
    total = 0.0
    for p in plan.placements.values():
        d = index.get(p.device_id)
        if d is None:
            raise ValueError(f"{p.task_id}: unknown device {p.device_id!r}")
        total += devices[d].cost_per_hour * (p.finish - p.start) / 3600.0
    links = priced_links(cost)
    if links is None:
        return total
    for (src, dst), nbytes in graph.edges.items():
        ps, pd = plan.placements.get(src), plan.placements.get(dst)
        if ps is None or pd is None or nbytes == 0:
            continue
        a, b = devices[index[ps.device_id]].site, devices[index[pd.device_id]].site
        if a != b:
            total += nbytes / GB * links.link(a, b).cost_per_gb
    return total


@dataclass(frozen=True, slots=True)
class Objective:
    """How the portfolio ranks plans; the default is makespan alone.

    Without a budget: minimise time_weight x makespan + money_weight x dollars.
    With a budget (dollars): the best plan by that sum within it (with money_weight 0: the
    shortest); if none is, the cheapest.
    """

    time_weight: float = 1.0
    money_weight: float = 0.0
    budget: float | None = None

    def __post_init__(self) -> None:
        for name in ("time_weight", "money_weight"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {v}")
        if self.budget is not None and not (self.budget >= 0 and math.isfinite(self.budget)):
            raise ValueError(f"budget must be finite and >= 0, got {self.budget}")

    @property
    def uses_money(self) -> bool:
        return self.money_weight > 0 or self.budget is not None

    def key(self, makespan: float, dollars: float) -> tuple[float, float]:
        """Smaller is better; equal keys are ties (the portfolio keeps the earlier plan)."""
        weighed = self.time_weight * makespan + self.money_weight * dollars
        if self.budget is not None:
            return (0.0, weighed) if dollars <= self.budget else (1.0, dollars)
        return (weighed, 0.0)


def site_prices(cluster: Cluster, cost: CostModel) -> NDArray[np.float64] | None:
    """$/byte from each site (row, by site code) to each device (column); None if free."""
    model = priced_links(cost)
    if model is None:
        return None
    sites = cluster.sites
    per_site = np.full((len(sites), len(sites)), model.wan.cost_per_gb / GB, dtype=np.float64)
    for (a, b), link in model.links.items():  # the same fallbacks as LinkCostModel.link
        if a in sites and b in sites:
            per_site[sites[a], sites[b]] = link.cost_per_gb / GB
            if (b, a) not in model.links:
                per_site[sites[b], sites[a]] = link.cost_per_gb / GB
    np.fill_diagonal(per_site, 0.0)  # data inside a site is free
    if not per_site.any():
        return None
    out: NDArray[np.float64] = per_site[:, cluster.site_codes]
    return out


def cost_aware_prepared(prep: Prepared, money_weight: float, name: str = "heft-money") -> Plan:
    """Cost-aware HEFT on an already checked request (the portfolio shares one `Prepared`)."""
    if not (math.isfinite(money_weight) and money_weight >= 0):
        raise ValueError(f"money_weight must be finite and >= 0, got {money_weight}")
    graph, w, cluster = prep.graph, prep.w, prep.cluster
    keys = priority_keys(prep.upward())
    if "run_dollars" not in prep.memo:
        rate = np.fromiter((d.cost_per_hour for d in cluster.devices), np.float64, len(cluster))
        prep.memo["run_dollars"] = np.where(np.isfinite(w), w, 0.0) * (rate / 3600.0)[None, :]
        prep.memo["site_prices"] = site_prices(cluster, prep.cost)
    run_dollars, site_dollars = prep.memo["run_dollars"], prep.memo["site_prices"]
    assert run_dollars is not None
    run_price = run_dollars * money_weight  # in seconds
    prices = None if site_dollars is None else site_dollars * money_weight
    site_codes = cluster.site_codes.tolist()
    preds = graph.preds

    def rule(s: ListScheduler, i: int, drt: NDArray[np.float64]) -> Choice:
        bias = run_price[i]
        if prices is not None and preds[i]:
            bias = bias.copy()
            for p, nbytes in preds[i]:
                if nbytes:
                    bias += nbytes * prices[site_codes[s.where[p]]]
        return s.earliest(i, drt, bias)

    return ListScheduler(prep).run(keys, rule, name)


def cost_aware_heft(
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    money_weight: float = 3600.0,
) -> Plan:
    """HEFT minimising finish + money_weight (seconds per dollar) x added dollars per task.

    The default values a dollar at an hour of makespan. Constraints and errors as `heft`.
    """
    return cost_aware_prepared(Prepared(graph, cluster, cost, fixed, now), money_weight)
