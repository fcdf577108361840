"""The pure scheduling core: a task graph + a cluster snapshot + a cost model -> a Plan.

No I/O, no asyncio, no clocks: the same inputs always give the same plan.
"""

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
from orchestrator.scheduling.heft import heft
from orchestrator.scheduling.model import Cluster, Device, Link, Task, TaskGraph
from orchestrator.scheduling.plan import Placement, Plan, PlanError
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
    "Placement",
    "Plan",
    "PlanError",
    "SlotTimeline",
    "Task",
    "TaskGraph",
    "TransferTable",
    "Unschedulable",
    "eligibility_mask",
    "eligibility_matrix",
    "heft",
    "ineligibility",
    "load_canonical",
    "load_canonical_example",
    "parse_canonical",
    "upward_ranks",
]
