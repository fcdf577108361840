"""Transfer times as vectors: from one source device to every device of a cluster at once.

HEFT needs, for every edge, the arrival time of the data on every candidate device; asking a
cost model one pair at a time would cost |edges| x |devices| Python calls. A TransferTable
answers a whole row with a few numpy operations, and the mean over device pairs (used by the
upward rank) in O(1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.model import Cluster, Device, Link


class TransferTable(Protocol):
    """Vectorised transfer times over one cluster."""

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        """Transfer time of `nbytes` from device index `src` to each device (a fresh array)."""
        ...

    def mean(self, nbytes: float) -> float:
        """Mean transfer time of `nbytes` over ordered pairs of distinct devices."""
        ...


class MatrixTransferTable:
    """Edge weights are times: `nbytes` between different devices, 0 on the same device."""

    __slots__ = ("_n",)

    def __init__(self, n_devices: int) -> None:
        self._n = n_devices

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        out = np.full(self._n, nbytes, dtype=np.float64)
        out[src] = 0.0
        return out

    def mean(self, nbytes: float) -> float:
        return nbytes if self._n >= 2 else 0.0


class LinkTransferTable:
    """Site-to-site links (LAN on the diagonal), local copies inside an agent, 0 on a device.

    Mirrors `LinkCostModel.transfer_time` exactly (same operations in the same order), so the
    times HEFT plans with are the times `Plan.validate` checks against.
    """

    __slots__ = ("_agent_members", "_bw", "_cluster", "_lat", "_local_Bps", "_mean", "_rows")

    def __init__(
        self,
        cluster: Cluster,
        links: Mapping[tuple[str, str], Link],
        lan: Link,
        wan: Link,
        local_Bps: float,
    ) -> None:
        self._cluster = cluster
        self._local_Bps = local_Bps
        sites = cluster.sites
        s = len(sites)
        lat = np.full((s, s), wan.latency_s, dtype=np.float64)
        bw = np.full((s, s), wan.bandwidth_Bps, dtype=np.float64)
        np.fill_diagonal(lat, lan.latency_s)
        np.fill_diagonal(bw, lan.bandwidth_Bps)
        for (a, b), link in links.items():
            if a not in sites or b not in sites:
                continue
            ia, ib = sites[a], sites[b]
            lat[ia, ib], bw[ia, ib] = link.latency_s, link.bandwidth_Bps
            if (b, a) not in links:
                lat[ib, ia], bw[ib, ia] = link.latency_s, link.bandwidth_Bps
        self._lat, self._bw = lat, bw
        self._rows: dict[int, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
        self._agent_members = [cluster.agent_members[a] for a in cluster.agents]  # by agent code
        self._mean = self._pair_sums()

    def _pair_sums(self) -> tuple[float, float]:
        """(mean latency, mean 1/bandwidth) over ordered pairs of distinct devices."""
        c = self._cluster
        n = len(c)
        if n < 2:
            return 0.0, 0.0
        counts = np.bincount(c.site_codes, minlength=len(c.sites)).astype(np.float64)
        pairs = np.outer(counts, counts) - np.diag(counts)
        sum_lat = float((pairs * self._lat).sum())
        sum_inv = float((pairs / self._bw).sum())
        local_pairs = 0.0
        for members in self._agent_members:
            if len(members) < 2:
                continue
            per_site = Counter(c.site_codes[members].tolist())
            for s, cs in per_site.items():
                for t, ct in per_site.items():
                    p = float(cs * ct if s != t else cs * (cs - 1))
                    sum_lat -= p * float(self._lat[s, t])
                    sum_inv -= p / float(self._bw[s, t])
                    local_pairs += p
        sum_inv += local_pairs / self._local_Bps
        total = float(n * (n - 1))
        return sum_lat / total, sum_inv / total

    def _site_rows(self, site: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rows = self._rows.get(site)
        if rows is None:
            codes = self._cluster.site_codes
            rows = self._rows[site] = (self._lat[site][codes], self._bw[site][codes])
        return rows

    def row(self, nbytes: float, src: int) -> NDArray[np.float64]:
        c = self._cluster
        lat, bw = self._site_rows(int(c.site_codes[src]))
        out = nbytes / bw
        out += lat
        members = self._agent_members[int(c.agent_codes[src])]
        if len(members) > 1:
            out[members] = nbytes / self._local_Bps
        out[src] = 0.0
        return out

    def mean(self, nbytes: float) -> float:
        lat, inv = self._mean
        return lat + nbytes * inv


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
        if self._mean is None:
            self._mean = self._fit()
        base, slope = self._mean
        return base + nbytes * slope
