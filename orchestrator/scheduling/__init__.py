"""The pure scheduling core: a task graph + a cluster snapshot + a cost model -> a Plan.

No I/O, no asyncio, no clocks: the same inputs always give the same plan. (One exception,
documented in `portfolio`: a wall-clock safety net that stops a runaway portfolio; which
algorithms it runs is decided from the problem size alone.)

Algorithms (all `(graph, cluster, cost, *, fixed=None, now=0.0) -> Plan`): `heft`, `cpop`,
`peft`, `heft_lookahead`, `cost_aware_heft`, and `portfolio`, which runs several and keeps
the best by an `Objective` (time, money, or a budget), optionally on `prefilter_cluster`'s
shortlist of a huge cluster.
"""

from orchestrator.scheduling.baselines import (
    earliest_start,
    least_loaded,
    round_robin,
    weighted_random,
)
from orchestrator.scheduling.canonical import (
    CanonicalExample,
    load_canonical,
    load_canonical_example,
    parse_canonical,
)
from orchestrator.scheduling.constraints import (
    Unschedulable,
    eligibility_mask,
    eligibility_matrix,
    eligible_everywhere,
    ineligibility,
)
from orchestrator.scheduling.cost import (
    DEFAULT_LAN,
    DEFAULT_WAN,
    BatchCostModel,
    CostModel,
    LinkCostModel,
    MatrixCostModel,
)
from orchestrator.scheduling.cpop import cpop
from orchestrator.scheduling.heft import heft
from orchestrator.scheduling.iterative import iterative_heft
from orchestrator.scheduling.lookahead import heft_lookahead
from orchestrator.scheduling.model import Cluster, Device, Link, Task, TaskGraph
from orchestrator.scheduling.money import Objective, cost_aware_heft, plan_cost
from orchestrator.scheduling.peft import optimistic_cost_table, peft
from orchestrator.scheduling.plan import Placement, Plan, PlanError
from orchestrator.scheduling.portfolio import portfolio
from orchestrator.scheduling.prefilter import prefilter_cluster
from orchestrator.scheduling.ranks import upward_ranks
from orchestrator.scheduling.timeline import SlotTimeline
from orchestrator.scheduling.transfer import TransferTable

__all__ = [
    "DEFAULT_LAN",
    "DEFAULT_WAN",
    "BatchCostModel",
    "CanonicalExample",
    "Cluster",
    "CostModel",
    "Device",
    "Link",
    "LinkCostModel",
    "MatrixCostModel",
    "Objective",
    "Placement",
    "Plan",
    "PlanError",
    "SlotTimeline",
    "Task",
    "TaskGraph",
    "TransferTable",
    "Unschedulable",
    "cost_aware_heft",
    "cpop",
    "earliest_start",
    "eligibility_mask",
    "eligibility_matrix",
    "eligible_everywhere",
    "heft",
    "heft_lookahead",
    "ineligibility",
    "iterative_heft",
    "least_loaded",
    "load_canonical",
    "load_canonical_example",
    "optimistic_cost_table",
    "parse_canonical",
    "peft",
    "plan_cost",
    "portfolio",
    "prefilter_cluster",
    "round_robin",
    "upward_ranks",
    "weighted_random",
]
