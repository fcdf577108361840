"""Money in a pipeline's plan: the objective its spec states, plans held to it, and the
refusal of a pipeline whose budget no plan fits.

Devices are priced by their agents' adverts ($/hour), data crossing sites by the links they
declare ($/GB); `scheduling.money` adds them up. The portfolio runs its cost-aware
candidates whenever a pipeline states a budget or a money weight, whatever its planning
budget (what a user is charged must not depend on how busy the planner was); here a plan
is priced, and one over its budget is replaced by the cheapest found or refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from orchestrator.scheduling import Cluster, CostModel, Placement, Plan, TaskGraph
from orchestrator.scheduling.constraints import Unschedulable
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.money import Objective, cost_aware_prepared, plan_cost
from orchestrator.scheduling.portfolio import MONEY_ONLY_WEIGHT
from schemas.pipeline import PipelineSpec

#: A plan's dollars above the budget by at most this share still fit it (rounding).
BUDGET_SLACK = 1e-9


def objective_of(spec: PipelineSpec) -> Objective | None:
    """The objective a spec states; None: makespan alone (no budget, no money weight)."""
    if spec.budget is None and not spec.money_weight:
        return None
    return Objective(money_weight=spec.money_weight, budget=spec.budget)


def fits(objective: Objective | None, dollars: float) -> bool:
    """Whether a plan of these dollars is within the objective's budget (if it has one)."""
    if objective is None or objective.budget is None:
        return True
    return dollars <= objective.budget * (1 + BUDGET_SLACK)


class OverBudget(Unschedulable):
    """No plan found fits the pipeline's budget; `cheapest` is the cost of the cheapest plan
    found (dollars) and `makespan` that plan's. Unschedulable: the request cannot be met."""

    def __init__(self, budget: float, cheapest: float, makespan: float) -> None:
        self.budget, self.cheapest, self.makespan = budget, cheapest, makespan
        super().__init__({})

    def _describe(self, per_task: int = 5) -> str:
        return (
            f"no plan fits the budget of ${self.budget:.6g}: the cheapest plan found costs "
            f"${self.cheapest:.6g} (predicted makespan {self.makespan:.3f} s)"
        )

    def details(self) -> dict[str, str]:
        return {
            "budget": f"{self.budget:.6g}",
            "cheapest_cost": f"{self.cheapest:.6g}",
            "cheapest_makespan_s": f"{self.makespan:.6g}",
        }

    def __reduce__(self) -> tuple[type[OverBudget], tuple[float, float, float]]:  # type: ignore[override]
        return (OverBudget, (self.budget, self.cheapest, self.makespan))


def held_to(
    plan: Plan,
    objective: Objective | None,
    graph: TaskGraph,
    cluster: Cluster,
    cost: CostModel,
    *,
    fixed: Mapping[str, Placement] | None = None,
    now: float = 0.0,
    refuse: bool = False,
) -> Plan:
    """`plan` (the portfolio's, which always runs its cost-aware candidates when money is
    asked, so it is already the best by `objective` it found), its `cost` set. With a budget
    it does not fit: cost-aware HEFT at a money-only rate if that is cheaper, or with
    `refuse` OverBudget with the cheapest cost found."""
    if plan.cost is not None and (objective is None or not objective.uses_money):
        return plan  # priced by the portfolio, which ranked it the only way asked
    dollars = plan.cost if plan.cost is not None else plan_cost(plan, graph, cluster, cost)
    best = replace(plan, cost=dollars)
    if objective is None or not objective.uses_money:
        return best
    if fits(objective, dollars):
        return best
    prep = Prepared(graph, cluster, cost, fixed, now)
    cheapest = cost_aware_prepared(prep, MONEY_ONLY_WEIGHT, "heft-money-only")
    cheapest_dollars = plan_cost(cheapest, graph, cluster, cost)
    if cheapest_dollars < dollars:
        best = replace(cheapest, cost=cheapest_dollars)
    assert best.cost is not None and objective.budget is not None
    if refuse and not fits(objective, best.cost):
        raise OverBudget(objective.budget, best.cost, best.makespan)
    return best
