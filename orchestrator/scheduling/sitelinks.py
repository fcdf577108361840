"""Link latency, bandwidth and price between a cluster's sites, as numpy arrays.

A LinkCostModel is a dict of (site, site) -> Link with fallbacks (the reverse direction, then
the WAN default; LAN default inside a site). A cluster of 10,000 devices may span 1,000 sites
with half a million listed links, so walking the dict per planning call costs more than the
plan. `SiteLinks` walks it once per cost model into arrays over every site the dict names;
`SiteView` then serves one cluster's sites from them: a single row when that is all a caller
needs (the transfers out of one device), or device x device matrices for a small cluster.
Even a handful of sites reads the arrays: asking `link()` per pair cost 40 us on 8 sites,
more than the plan.

The arrays hold exactly the values `link()` returns, so times computed from them are the
times `LinkCostModel.transfer_time` gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.model import Link

Arrays = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]


class SiteLinks:
    """Every named site's links as (latency, bandwidth, $/GB) arrays, built on first use.

    Index `len(names)` stands for any site the dict does not name (WAN to everything).
    """

    __slots__ = ("_arrays", "_index", "_inv_bw", "_links", "lan", "wan")

    def __init__(self, links: Mapping[tuple[str, str], Link], lan: Link, wan: Link) -> None:
        self._links, self.lan, self.wan = links, lan, wan
        self._index: dict[str, int] | None = None
        self._arrays: Arrays | None = None
        self._inv_bw: NDArray[np.float64] | None = None

    def inverse_bandwidth(self) -> NDArray[np.float64]:
        """1 / bandwidth over every named site (plus the unnamed index), cached."""
        if self._inv_bw is None:
            self._inv_bw = 1.0 / self._build()[1][1]
        return self._inv_bw

    def _build(self) -> tuple[dict[str, int], Arrays]:
        if self._index is not None and self._arrays is not None:
            return self._index, self._arrays
        links = self._links
        names = sorted({s for pair in links for s in pair})
        index = {s: k for k, s in enumerate(names)}
        g = len(names) + 1
        wan, lan = self.wan, self.lan
        lat = np.full((g, g), wan.latency_s, dtype=np.float64)
        bw = np.full((g, g), wan.bandwidth_Bps, dtype=np.float64)
        price = np.full((g, g), wan.cost_per_gb, dtype=np.float64)
        known = np.arange(len(names))
        lat[known, known], bw[known, known], price[known, known] = (
            lan.latency_s,
            lan.bandwidth_Bps,
            lan.cost_per_gb,
        )
        src = np.fromiter((index[a] for a, _ in links), np.intp, len(links))
        dst = np.fromiter((index[b] for _, b in links), np.intp, len(links))
        values = list(links.values())
        l_lat = np.fromiter((v.latency_s for v in values), np.float64, len(values))
        l_bw = np.fromiter((v.bandwidth_Bps for v in values), np.float64, len(values))
        l_pr = np.fromiter((v.cost_per_gb for v in values), np.float64, len(values))
        # A missing direction falls back to the listed reverse one; listed ones override.
        rev = np.fromiter(((b, a) not in links for a, b in links), np.bool_, len(links))
        rev &= src != dst
        for arr, vals in ((lat, l_lat), (bw, l_bw), (price, l_pr)):
            arr[dst[rev], src[rev]] = vals[rev]
            arr[src, dst] = vals
        self._index, self._arrays = index, (lat, bw, price)
        return index, self._arrays

    def view(self, sites: Sequence[str]) -> SiteView:
        """The links among `sites` (a cluster's sites in code order)."""
        index, arrays = self._build()
        missing = len(index)
        codes = np.fromiter((index.get(n, missing) for n in sites), np.intp, len(sites))
        return SiteView(codes, self, arrays)


class SiteView:
    """Links among one cluster's sites (by site code): rows on demand, cached."""

    __slots__ = ("_arrays", "_codes", "_links", "_rows", "_unnamed")

    def __init__(self, codes: NDArray[np.intp], links: SiteLinks, arrays: Arrays) -> None:
        self._codes, self._links, self._arrays = codes, links, arrays
        self._unnamed = len(arrays[0]) - 1  # the index of every site the dict does not name
        self._rows: dict[int, Arrays] = {}

    def diagonal(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(latency, bandwidth) inside each site."""
        codes = self._codes
        lat, bw = self._arrays[0][codes, codes], self._arrays[1][codes, codes]
        unnamed = codes == self._unnamed
        lan = self._links.lan
        lat[unnamed], bw[unnamed] = lan.latency_s, lan.bandwidth_Bps
        return lat, bw

    def weighted_sums(self, counts: NDArray[np.float64]) -> tuple[float, float]:
        """(sum over site pairs s, t of counts[s] counts[t] latency[s, t], the same for
        1 / bandwidth), without building the site x site matrices."""
        size = len(self._arrays[0])
        per = np.bincount(self._codes, weights=counts, minlength=size)
        q_lat = float(per @ self._arrays[0] @ per)
        q_inv = float(per @ self._links.inverse_bandwidth() @ per)
        # Unnamed sites share one index, whose diagonal is WAN; inside each it is LAN.
        own = counts[self._codes == self._unnamed]
        sq = float((own * own).sum())
        lan, wan = self._links.lan, self._links.wan
        q_lat += sq * (lan.latency_s - wan.latency_s)
        q_inv += sq * (1.0 / lan.bandwidth_Bps - 1.0 / wan.bandwidth_Bps)
        return q_lat, q_inv

    def row(self, s: int) -> Arrays:
        """(latency, bandwidth, $/GB) from site code `s` to every site code."""
        got = self._rows.get(s)
        if got is not None:
            return got
        codes = self._codes
        lat, bw, price = (a[codes[s]][codes] for a in self._arrays)
        if codes[s] == self._unnamed:  # unnamed site: LAN inside itself
            lan = self._links.lan
            lat[s], bw[s], price[s] = lan.latency_s, lan.bandwidth_Bps, lan.cost_per_gb
        got = (lat, bw, price)
        self._rows[s] = got
        return got

    def device_pairs(
        self, site_codes: NDArray[np.int64]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(latency, bandwidth) between devices on sites `site_codes`, device x device: the
        links between their sites, LAN inside an unnamed site."""
        idx = self._codes.take(site_codes)
        lat = self._arrays[0].take(idx, axis=0).take(idx, axis=1)
        bw = self._arrays[1].take(idx, axis=0).take(idx, axis=1)
        unnamed = idx == self._unnamed
        if unnamed.any():  # two devices on one unnamed site: LAN (the shared index is WAN)
            inside = (site_codes[:, None] == site_codes[None, :]) & unnamed[:, None]
            lan = self._links.lan
            lat[inside], bw[inside] = lan.latency_s, lan.bandwidth_Bps
        return lat, bw
