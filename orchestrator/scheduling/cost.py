"""How long things take: the narrow cost-model protocol and the two models the core ships.

Any object with `compute_time` and `transfer_time` is a CostModel (the predictor, the
simulator and tests each bring their own). A model may also implement `compute_matrix` and
`transfer_table` (BatchCostModel) so schedulers can work on whole vectors; `cost_arrays`
falls back to per-pair calls for models that do not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeGuard, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.model import Cluster, Device, Link, Task
from orchestrator.scheduling.sitelinks import SiteLinks, SiteView
from orchestrator.scheduling.transfer import (
    GenericTransferTable,
    LinkTransferTable,
    MatrixTransferTable,
    TransferTable,
)

DEFAULT_LAN = Link(latency_s=1e-3, bandwidth_Bps=125e6)
DEFAULT_WAN = Link(latency_s=0.1, bandwidth_Bps=25e6 / 8)


@runtime_checkable
class CostModel(Protocol):
    def compute_time(self, task: Task, device: Device) -> float: ...

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float: ...


@runtime_checkable
class BatchCostModel(CostModel, Protocol):
    """A cost model that can also answer for a whole cluster at once (must agree per pair)."""

    def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
        """tasks x devices compute times; inf where the task cannot run."""
        ...

    def transfer_table(self, cluster: Cluster) -> TransferTable: ...


class LinkCostModel:
    """Compute = work / speed; transfer over the link between the two devices' locations.

    Same device: 0. Same agent: a local copy at `local_Bps`. Same site: the site's LAN
    (`links[(site, site)]` or `lan`). Different sites: `links[(a, b)]`, else `links[(b, a)]`,
    else `wan`. Transfer time is `latency + bytes / bandwidth`.
    """

    __slots__ = ("_site_links", "_table", "lan", "links", "local_Bps", "wan")

    def __init__(
        self,
        links: Mapping[tuple[str, str], Link] | None = None,
        *,
        lan: Link = DEFAULT_LAN,
        wan: Link = DEFAULT_WAN,
        local_Bps: float = 10e9,
    ) -> None:
        if not local_Bps > 0:
            raise ValueError("local_Bps must be > 0")
        self.links: dict[tuple[str, str], Link] = dict(links or {})
        self.lan = lan
        self.wan = wan
        self.local_Bps = local_Bps
        self._site_links: SiteLinks | None = None
        self._table: tuple[Cluster, LinkTransferTable] | None = None

    def link(self, src_site: str, dst_site: str) -> Link:
        if src_site == dst_site:
            return self.links.get((src_site, src_site), self.lan)
        found = self.links.get((src_site, dst_site))
        if found is None:
            found = self.links.get((dst_site, src_site), self.wan)
        return found

    def site_view(self, cluster: Cluster) -> SiteView:
        """The links among `cluster`'s sites as arrays (see `sitelinks`); the link dict is
        read once per model, so treat `links`, `lan` and `wan` as frozen after first use."""
        if self._site_links is None:
            self._site_links = SiteLinks(self.links, self.lan, self.wan)
        names = sorted(cluster.sites, key=cluster.sites.__getitem__)
        return self._site_links.view(names)

    def compute_time(self, task: Task, device: Device) -> float:
        return task.work / device.speed

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float:
        if src.id == dst.id:
            return 0.0
        if src.agent_id == dst.agent_id:
            return nbytes / self.local_Bps
        link = self.link(src.site, dst.site)
        return link.latency_s + nbytes / link.bandwidth_Bps

    def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
        work = np.fromiter((t.work for t in tasks), np.float64, len(tasks))
        out: NDArray[np.float64] = work[:, None] / cluster.speed[None, :]
        return out

    def transfer_table(self, cluster: Cluster) -> TransferTable:
        """The table for `cluster`, kept for the last cluster asked about: the algorithms of one
        portfolio, and requests against an unchanged cluster view, share its link matrices and
        means instead of building them again (clusters are snapshots, never changed)."""
        last = self._table
        if last is not None and last[0] is cluster:
            return last[1]
        table = LinkTransferTable(cluster, self.site_view(cluster), self.local_Bps)
        self._table = (cluster, table)
        return table


class MatrixCostModel:
    """Unrelated machines, as in the published examples: `compute[task_id][device_id]` is the
    execution time (missing = cannot run there, inf); an edge's weight is its transfer time
    between different devices (0 on the same device)."""

    __slots__ = ("compute",)

    def __init__(self, compute: Mapping[str, Mapping[str, float]]) -> None:
        self.compute: dict[str, dict[str, float]] = {
            t: {d: float(v) for d, v in row.items()} for t, row in compute.items()
        }

    def compute_time(self, task: Task, device: Device) -> float:
        return self.compute.get(task.id, {}).get(device.id, math.inf)

    def transfer_time(self, nbytes: float, src: Device, dst: Device) -> float:
        return 0.0 if src.id == dst.id else nbytes

    def compute_matrix(self, tasks: Sequence[Task], cluster: Cluster) -> NDArray[np.float64]:
        out = np.full((len(tasks), len(cluster)), math.inf, dtype=np.float64)
        for i, task in enumerate(tasks):
            row = self.compute.get(task.id)
            if not row:
                continue
            for dev_id, t in row.items():
                j = cluster.index.get(dev_id)
                if j is not None:
                    out[i, j] = t
        return out

    def transfer_table(self, cluster: Cluster) -> TransferTable:
        return MatrixTransferTable(len(cluster))


def is_batch(cost: CostModel) -> TypeGuard[BatchCostModel]:
    """`isinstance(cost, BatchCostModel)` without the runtime protocol check's ~20 us."""
    return callable(getattr(cost, "compute_matrix", None)) and callable(
        getattr(cost, "transfer_table", None)
    )


def cost_arrays(
    cost: CostModel, tasks: Sequence[Task], cluster: Cluster, eligible: NDArray[np.bool_]
) -> tuple[NDArray[np.float64], TransferTable]:
    """The compute-time matrix (inf where ineligible or not finite) and a transfer table."""
    if is_batch(cost):
        w = np.asarray(cost.compute_matrix(tasks, cluster), dtype=np.float64)
        if w.shape != (len(tasks), len(cluster)):
            raise ValueError(f"compute_matrix returned shape {w.shape}")
        table = cost.transfer_table(cluster)
    else:
        w = np.full((len(tasks), len(cluster)), math.inf, dtype=np.float64)
        devices = cluster.devices
        for i, task in enumerate(tasks):
            for j in np.flatnonzero(eligible[i]).tolist():
                w[i, j] = cost.compute_time(task, devices[j])
        table = GenericTransferTable(cost.transfer_time, devices)
    if w.size and np.fmin.reduce(w, axis=None) < 0:  # fmin: NaN (made inf below) skipped
        raise ValueError("cost model returned a negative compute time")
    usable = np.isfinite(w)
    usable &= eligible
    # a new array either way: the model may hand out one it keeps
    if np.logical_and.reduce(usable, axis=None):
        w = np.array(w, order="C")
    else:
        w = np.where(usable, w, math.inf)
    return w, table
