"""Transfer times as vectors: from one source device to every device of a cluster at once.

HEFT needs, for every edge, the arrival time of the data on every candidate device; asking a
cost model one pair at a time would cost |edges| x |devices| Python calls. A TransferTable
answers a whole row with a few numpy operations, and the mean over device pairs (used by the
upward rank) in O(1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.model import Cluster, Device
from orchestrator.scheduling.sitelinks import SiteView


class TransferTable(Protocol):
    """Vectorised transfer times over one cluster."""

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        """Transfer time of `nbytes` from device index `src` to each device (a fresh array)."""
        ...

    def mean(self, nbytes: float) -> float:
        """Mean transfer time of `nbytes` over ordered pairs of distinct devices."""
        ...

    def affine(self) -> tuple[float, float]:
        """(a, b) with mean(nbytes) == a + nbytes * b exactly, for loops that inline it."""
        ...

    def dense(self) -> Dense | None:
        """(latency, bandwidth) device x device matrices when small enough to hold, else None;
        transfer(src, dst, b) == b / bw[src, dst] + lat[src, dst], computed in that order so
        it is bit-identical to `row` (bandwidth is inf on the same device)."""
        ...

    def dense_lists(self) -> Lists | None:
        """`dense()` as nested Python lists, for clusters of at most LISTS_MAX devices."""
        ...


Dense = tuple[NDArray[np.float64], NDArray[np.float64]]
#: Largest cluster for which dense device x device matrices are built (2 x 0.5 MB at 256);
#: larger clusters use per-site rows.
DENSE_MAX = 256
#: Up to this size the dense rows are also kept as Python lists: for a handful of devices,
#: plain float arithmetic beats numpy's per-call overhead.
LISTS_MAX = 32
Lists = tuple[list[list[float]], list[list[float]]]


def as_lists(dense: Dense | None) -> Lists | None:
    if dense is None or len(dense[0]) > LISTS_MAX:
        return None
    return dense[0].tolist(), dense[1].tolist()


class MatrixTransferTable:
    """Edge weights are times: `nbytes` between different devices, 0 on the same device."""

    __slots__ = ("_dense", "_lists", "_lists_ready", "_n")

    def __init__(self, n_devices: int) -> None:
        self._n = n_devices
        self._dense: Dense | None = None
        self._lists: Lists | None = None
        self._lists_ready = False

    def dense_lists(self) -> Lists | None:
        if not self._lists_ready:
            self._lists, self._lists_ready = as_lists(self.dense()), True
        return self._lists

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        out = np.full(self._n, nbytes, dtype=np.float64)
        out[src] = 0.0
        return out

    def mean(self, nbytes: float) -> float:
        return nbytes if self._n >= 2 else 0.0

    def affine(self) -> tuple[float, float]:
        return (0.0, 1.0) if self._n >= 2 else (0.0, 0.0)

    def dense(self) -> Dense | None:
        if self._dense is None and self._n <= DENSE_MAX:
            bw = np.ones((self._n, self._n), dtype=np.float64)
            np.fill_diagonal(bw, np.inf)
            self._dense = (np.zeros((self._n, self._n), dtype=np.float64), bw)
        return self._dense


class LinkTransferTable:
    """Site-to-site links (LAN on the diagonal), local copies inside an agent, 0 on a device.

    Mirrors `LinkCostModel.transfer_time` exactly (same operations in the same order), so the
    times HEFT plans with are the times `Plan.validate` checks against. Site rows are fetched
    from the `SiteView` on first use and the mean over device pairs on the first `mean` call,
    so a caller that needs only a few rows of a huge cluster pays only for those.
    """

    __slots__ = (
        "_agent_names",
        "_cluster",
        "_dense",
        "_lists",
        "_lists_ready",
        "_local_Bps",
        "_mean",
        "_rows",
        "_view",
    )

    def __init__(self, cluster: Cluster, view: SiteView, local_Bps: float) -> None:
        self._cluster = cluster
        self._view = view
        self._local_Bps = local_Bps
        self._rows: dict[int, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
        self._agent_names = list(cluster.agents)  # by agent code
        self._mean: tuple[float, float] | None = None
        self._dense: Dense | None = None
        self._lists: Lists | None = None
        self._lists_ready = False

    def dense_lists(self) -> Lists | None:
        if not self._lists_ready:
            self._lists, self._lists_ready = as_lists(self.dense()), True
        return self._lists

    def dense(self) -> Dense | None:
        c = self._cluster
        if self._dense is None and len(c) <= DENSE_MAX:
            lat, bw = self._view.device_pairs(c.site_codes)
            if len(c.agents) < len(c):  # some agent has several devices: local copies
                same_agent = c.agent_codes[:, None] == c.agent_codes[None, :]
                lat[same_agent] = 0.0
                bw[same_agent] = self._local_Bps
            diagonal = slice(None, None, len(c) + 1)  # of the flattened matrices
            lat.reshape(-1)[diagonal] = 0.0
            bw.reshape(-1)[diagonal] = np.inf
            self._dense = (lat, bw)
        return self._dense

    def _pair_sums(self) -> tuple[float, float]:
        """(mean latency, mean 1/bandwidth) over ordered pairs of distinct devices."""
        c = self._cluster
        n = len(c)
        if n < 2:
            return 0.0, 0.0
        dense = self.dense()
        if dense is not None:  # the diagonal is 0 latency, infinite bandwidth: no pair
            total = float(n * (n - 1))
            inv = np.divide(1.0, dense[1])
            return (
                float(np.add.reduce(dense[0], axis=None)) / total,
                float(np.add.reduce(inv, axis=None)) / total,
            )
        view = self._view
        counts = np.bincount(c.site_codes, minlength=len(c.sites)).astype(np.float64)
        sum_lat, sum_inv = view.weighted_sums(counts)
        lat_d, bw_d = view.diagonal()
        sum_lat -= float((counts * lat_d).sum())  # a device and itself is not a pair
        sum_inv -= float((counts / bw_d).sum())
        # Pairs inside one agent copy locally instead of over the site link.
        n_sites = len(c.sites)
        key = c.agent_codes * n_sites + c.site_codes
        groups, sizes = np.unique(key, return_counts=True)
        agent, site = groups // n_sites, groups % n_sites
        one_site = np.bincount(agent, minlength=len(c.agents))[agent] == 1
        p = (sizes * (sizes - 1)).astype(np.float64)[one_site]
        s1 = site[one_site]
        sum_lat -= float((p * lat_d[s1]).sum())
        sum_inv -= float((p / bw_d[s1]).sum())
        local_pairs = float(p.sum())
        for a in np.unique(agent[~one_site]).tolist():
            mine = agent == a
            for s, cs in zip(site[mine].tolist(), sizes[mine].tolist(), strict=True):
                lat_row, bw_row, _ = view.row(s)
                for t, ct in zip(site[mine].tolist(), sizes[mine].tolist(), strict=True):
                    q = float(cs * ct if s != t else cs * (cs - 1))
                    sum_lat -= q * float(lat_row[t])
                    sum_inv -= q / float(bw_row[t])
                    local_pairs += q
        sum_inv += local_pairs / self._local_Bps
        total = float(n * (n - 1))
        return sum_lat / total, sum_inv / total

    def _site_rows(self, site: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rows = self._rows.get(site)
        if rows is None:
            codes = self._cluster.site_codes
            lat, bw, _ = self._view.row(site)
            rows = self._rows[site] = (lat[codes], bw[codes])
        return rows

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        c = self._cluster
        lat, bw = self._site_rows(int(c.site_codes[src]))
        out = nbytes / bw
        out += lat
        members = c.agent_members[self._agent_names[int(c.agent_codes[src])]]
        if len(members) > 1:
            out[members] = nbytes / self._local_Bps
        out[src] = 0.0
        return out

    def mean(self, nbytes: float) -> float:
        lat, inv = self.affine()
        return lat + nbytes * inv

    def affine(self) -> tuple[float, float]:
        if self._mean is None:
            self._mean = self._pair_sums()
        return self._mean


TransferFn = Callable[[float, Device, Device], float]


class GenericTransferTable:
    """Fallback for cost models without a table: one Python call per pair (slow, always right).

    The mean is estimated from a deterministic sample of at most `sample` devices, assuming
    transfer time is affine in the byte count (latency + bytes * slope).
    """

    __slots__ = ("_devices", "_fn", "_mean", "_sample")

    _REF_BYTES = 1e6

    def __init__(self, fn: TransferFn, devices: Sequence[Device], sample: int = 24) -> None:
        self._fn = fn
        self._devices = tuple(devices)
        self._sample = sample
        self._mean: tuple[float, float] | None = None

    def dense(self) -> Dense | None:
        return None

    def dense_lists(self) -> Lists | None:
        return None

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        fn, s = self._fn, self._devices[src]
        return np.fromiter((fn(nbytes, s, d) for d in self._devices), np.float64)

    def _fit(self) -> tuple[float, float]:
        n = len(self._devices)
        if n < 2:
            return 0.0, 0.0
        idx = sorted(set(np.linspace(0, n - 1, min(n, self._sample)).astype(int).tolist()))
        devs = [self._devices[i] for i in idx]
        pairs = [(a, b) for a in devs for b in devs if a is not b]
        m0 = sum(self._fn(0.0, a, b) for a, b in pairs) / len(pairs)
        m1 = sum(self._fn(self._REF_BYTES, a, b) for a, b in pairs) / len(pairs)
        return m0, (m1 - m0) / self._REF_BYTES

    def mean(self, nbytes: float) -> float:
        base, slope = self.affine()
        return base + nbytes * slope

    def affine(self) -> tuple[float, float]:
        if self._mean is None:
            self._mean = self._fit()
        return self._mean
