"""Link costs measured from this agent to its peers, advertised as `LinkSpec`s.

Why: communication-aware placement is only as good as its link model, and declared figures go
stale. Every agent answers probes; an agent with probing enabled learns its peers from their
adverts and, on a jittered schedule and within a byte budget, times a few small request/replies
(RTT) and one larger payload (bandwidth) per chosen peer. Per-peer figures are smoothed (EWMA)
and summarised per destination site (median over that site's peers).

The parts that decide (target choice, smoothing, aggregation, when to re-advertise) are pure
functions; `LinkProber` only adds the NATS I/O around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from edge_agent.config import AgentConfig
from schemas import subjects
from schemas.agent import AgentAdvert, LinkSpec
from schemas.codec import DecodeError, decode, encoding_of, error_reply
from schemas.limits import MAX_LINKS, MAX_PROBE_BYTES

log = logging.getLogger("mars.agent.links")

#: Payload of an RTT probe; replies to payloads up to ECHO_LIMIT are the payload itself.
SMALL_PROBE_BYTES = 32
ECHO_LIMIT = 64
RTT_SAMPLES = 3
PROBE_TIMEOUT_S = 2.0
EWMA_ALPHA = 0.3
#: Peers remembered at most (adverts of a huge fleet must not grow this without bound).
MAX_PEERS = 4096
#: Consecutive failed probes after which a peer's estimate is dropped.
FAILURES_TO_FORGET = 3
#: Fastest link we claim (Mbit/s): a bulk probe barely slower than the RTT says "very fast",
#: not "infinitely fast".
MAX_MBPS = 1e6
#: Shortest time we credit to moving the bulk payload (s), for the same reason.
MIN_BULK_S = 1e-5
#: Re-advertise a site's link only when latency moved by more than this fraction (and at least
#: LATENCY_FLOOR_MS) or bandwidth by more than BANDWIDTH_CHANGE: adverts stay quiet.
LATENCY_CHANGE = 0.10
LATENCY_FLOOR_MS = 0.5
BANDWIDTH_CHANGE = 0.20


async def answer_probe(nc: Any, msg: Msg) -> None:
    """Echo a small probe, acknowledge a large one with its length, refuse an oversized one.
    The reply is never larger than ECHO_LIMIT bytes (plus an error envelope), so a probe cannot
    be used to amplify traffic."""
    if not msg.reply:
        return
    n = len(msg.data)
    if n > MAX_PROBE_BYTES:
        body, headers = error_reply(
            "payload_too_large",
            f"probe of {n} bytes exceeds {MAX_PROBE_BYTES}",
            None,
            encoding_of(msg.headers),
        )
        await nc.publish(msg.reply, body, headers=headers)
        return
    await nc.publish(msg.reply, msg.data if n <= ECHO_LIMIT else str(n).encode())


# -- pure parts -------------------------------------------------------------------------------
@dataclass(slots=True)
class Peer:
    agent_id: str
    site: str
    tier: str
    last_seen: float
    ttl_s: float


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One probe of one peer: the small RTTs (ms) and the bulk payload's time (s, if it ran)."""

    rtts_ms: tuple[float, ...]
    bulk_s: float | None = None
    bulk_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PeerEstimate:
    rtt_ms: float
    jitter_ms: float
    bandwidth_mbps: float | None
    samples: int = 1


def ewma(prev: float | None, sample: float, alpha: float = EWMA_ALPHA) -> float:
    return sample if prev is None else (1.0 - alpha) * prev + alpha * sample


def rtt_and_jitter(rtts_ms: Sequence[float]) -> tuple[float, float]:
    """Median RTT and the mean difference between consecutive RTTs (RFC 3550's idea)."""
    if not rtts_ms:
        raise ValueError("no RTT samples")
    diffs = [abs(b - a) for a, b in itertools.pairwise(rtts_ms)]
    return statistics.median(rtts_ms), (statistics.fmean(diffs) if diffs else 0.0)


def bandwidth_mbps(nbytes: int, bulk_s: float, rtt_s: float) -> float:
    """Bandwidth from the bulk payload's time minus the small-message RTT (Mbit/s)."""
    moving = max(bulk_s - rtt_s, MIN_BULK_S)
    return min(nbytes * 8 / moving / 1e6, MAX_MBPS)


def update_estimate(
    prev: PeerEstimate | None, sample: ProbeSample, alpha: float = EWMA_ALPHA
) -> PeerEstimate:
    rtt, jitter = rtt_and_jitter(sample.rtts_ms)
    bw = None
    if sample.bulk_s is not None and sample.bulk_bytes > 0:
        bw = bandwidth_mbps(sample.bulk_bytes, sample.bulk_s, rtt / 1e3)
    if prev is None:
        return PeerEstimate(rtt, jitter, bw)
    if bw is None:
        new_bw = prev.bandwidth_mbps
    elif prev.bandwidth_mbps is None:
        new_bw = bw
    else:
        new_bw = ewma(prev.bandwidth_mbps, bw, alpha)
    return PeerEstimate(
        ewma(prev.rtt_ms, rtt, alpha), ewma(prev.jitter_ms, jitter, alpha), new_bw, prev.samples + 1
    )


def choose_targets(
    peers: Iterable[Peer],
    last_probed: Mapping[str, int],
    max_peers: int,
    per_site: int,
    rng: random.Random,
    own_site: str = "",
) -> list[Peer]:
    """Peers to probe this round: sites probed longest ago first (never-probed ones before all,
    this agent's own site winning ties), at most `per_site` random peers of each, at most
    `max_peers` in all. Rotating over sites covers every site, the cloud included, in turn."""
    by_site: dict[str, list[Peer]] = {}
    for p in peers:
        by_site.setdefault(p.site, []).append(p)
    order = sorted(by_site, key=lambda s: (last_probed.get(s, -1), s != own_site, rng.random()))
    out: list[Peer] = []
    for site in order:
        room = max_peers - len(out)
        if room <= 0:
            break
        group = sorted(by_site[site], key=lambda p: p.agent_id)
        out.extend(rng.sample(group, min(per_site, room, len(group))))
    return out


def site_links(
    peers: Mapping[str, Peer],
    estimates: Mapping[str, PeerEstimate],
    costs: Mapping[str, float] | None = None,
) -> dict[str, LinkSpec]:
    """One measured link per destination site: median over its peers of one-way latency
    (RTT / 2), bandwidth and jitter. Peers without a bandwidth figure yet do not count."""
    groups: dict[str, list[PeerEstimate]] = {}
    for agent_id, est in estimates.items():
        peer = peers.get(agent_id)
        if peer is None or est.bandwidth_mbps is None:
            continue
        groups.setdefault(peer.site, []).append(est)
    out: dict[str, LinkSpec] = {}
    for site, ests in groups.items():
        out[site] = LinkSpec(
            to_site=site,
            latency_ms=round(statistics.median(e.rtt_ms for e in ests) / 2.0, 4),
            bandwidth_mbps=round(statistics.median(e.bandwidth_mbps or 0.0 for e in ests), 2),
            cost_per_gb=(costs or {}).get(site, 0.0),
            measured=True,
            jitter_ms=round(statistics.median(e.jitter_ms for e in ests), 4),
        )
    return out


def significant(old: LinkSpec | None, new: LinkSpec) -> bool:
    """Whether `new` differs enough from what is advertised to be worth a new advert."""
    if old is None:
        return True
    dl = abs(new.latency_ms - old.latency_ms)
    if dl > max(LATENCY_CHANGE * old.latency_ms, LATENCY_FLOOR_MS):
        return True
    return abs(new.bandwidth_mbps / old.bandwidth_mbps - 1.0) > BANDWIDTH_CHANGE


def merge_links(declared: Sequence[LinkSpec], measured: Mapping[str, LinkSpec]) -> list[LinkSpec]:
    """Measured links, then declared ones for sites never measured (bounded for the advert)."""
    out = [measured[s] for s in sorted(measured)]
    out += [d for d in declared if d.to_site not in measured]
    return out[:MAX_LINKS]


# -- I/O --------------------------------------------------------------------------------------
class LinkProber:
    """Peer table, per-peer estimates and the advertised measured links of one agent."""

    def __init__(
        self,
        agent_id: str,
        config: AgentConfig,
        *,
        advert_every: int,
        rng: random.Random | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.site = config.site
        self.every_s = config.link_probe_every_s
        self.max_peers = config.link_probe_max_peers
        self.per_site = config.link_probe_per_site
        self.budget = config.link_probe_budget_bytes
        self.bulk_bytes = config.link_probe_bytes
        self.costs = {link.to_site: link.cost_per_gb for link in config.links}
        self.advert_every = advert_every
        self.rng = rng or random.Random()
        self.peers: dict[str, Peer] = {}
        self.estimates: dict[str, PeerEstimate] = {}
        self.failures: dict[str, int] = {}
        self.last_probed: dict[str, int] = {}
        #: What the advert carries per measured site.
        self.measured: dict[str, LinkSpec] = {}
        self.rounds = 0
        self._small = os.urandom(SMALL_PROBE_BYTES)
        self._bulk = b""

    @property
    def enabled(self) -> bool:
        return self.every_s > 0

    def links(self, declared: Sequence[LinkSpec]) -> list[LinkSpec]:
        return merge_links(declared, self.measured)

    # peers ----------------------------------------------------------------------------------
    def on_advert(self, adv: AgentAdvert, now: float) -> None:
        if adv.agent_id == self.agent_id:
            return
        if adv.agent_id not in self.peers and len(self.peers) >= MAX_PEERS:
            return
        ttl = 3.0 * self.advert_every * adv.heartbeat_interval_s + 1.0
        self.peers[adv.agent_id] = Peer(adv.agent_id, adv.site, adv.tier, now, ttl)

    def prune(self, now: float) -> None:
        """Forget peers whose adverts stopped (and what was measured to them)."""
        for aid in [a for a, p in self.peers.items() if now - p.last_seen > p.ttl_s]:
            del self.peers[aid]
            self.estimates.pop(aid, None)
            self.failures.pop(aid, None)

    async def _on_advert(self, msg: Msg) -> None:
        try:
            adv = decode(msg.data, AgentAdvert, encoding_of(msg.headers))
        except DecodeError:
            return
        self.on_advert(adv, time.monotonic())

    async def attach(self, nc: Any) -> Any:
        """Learn peers from every agent's advert (the subscription is returned)."""
        self._bulk = os.urandom(self.bulk_bytes)
        return await nc.subscribe(subjects.ALL_ADVERTS, cb=self._on_advert)

    # probing --------------------------------------------------------------------------------
    async def _timed(self, nc: Any, subject: str, payload: bytes, expect: bytes) -> float | None:
        t0 = time.perf_counter()
        try:
            reply = await nc.request(subject, payload, timeout=PROBE_TIMEOUT_S)
        except (TimeoutError, nats.errors.Error):
            return None
        dt = time.perf_counter() - t0
        return dt if reply.data == expect else None

    async def probe_peer(self, nc: Any, peer: Peer, *, bulk: bool) -> ProbeSample | None:
        subject = subjects.probe(peer.agent_id)
        rtts: list[float] = []
        for _ in range(RTT_SAMPLES):
            dt = await self._timed(nc, subject, self._small, self._small)
            if dt is None:
                return None
            rtts.append(dt * 1e3)
        bulk_s = None
        if bulk and self._bulk:
            bulk_s = await self._timed(nc, subject, self._bulk, str(len(self._bulk)).encode())
        return ProbeSample(tuple(rtts), bulk_s, len(self._bulk) if bulk_s is not None else 0)

    def _record(self, peer: Peer, sample: ProbeSample | None) -> None:
        if sample is None:
            n = self.failures.get(peer.agent_id, 0) + 1
            self.failures[peer.agent_id] = n
            if n >= FAILURES_TO_FORGET:
                self.estimates.pop(peer.agent_id, None)
            return
        self.failures.pop(peer.agent_id, None)
        self.estimates[peer.agent_id] = update_estimate(self.estimates.get(peer.agent_id), sample)

    def refresh(self) -> bool:
        """Recompute per-site links; True when the advertised set changed."""
        fresh = site_links(self.peers, self.estimates, self.costs)
        changed = False
        for site in [s for s in self.measured if s not in fresh]:
            del self.measured[site]
            changed = True
        for site, link in fresh.items():
            if significant(self.measured.get(site), link):
                self.measured[site] = link
                changed = True
        return changed

    async def round(self, nc: Any) -> bool:
        """One probe round within the budget; True when the advertised links changed."""
        self.prune(time.monotonic())
        self.rounds += 1
        targets = choose_targets(
            self.peers.values(),
            self.last_probed,
            self.max_peers,
            self.per_site,
            self.rng,
            own_site=self.site,
        )
        spent = 0
        for peer in targets:
            small = RTT_SAMPLES * SMALL_PROBE_BYTES
            if spent + small > self.budget:
                break
            bulk = spent + small + len(self._bulk) <= self.budget
            sample = await self.probe_peer(nc, peer, bulk=bulk)
            spent += small + (len(self._bulk) if bulk else 0)
            self.last_probed[peer.site] = self.rounds
            self._record(peer, sample)
        return self.refresh()

    async def run(
        self, nc: Any, stopped: asyncio.Event, on_change: Callable[[], Awaitable[None]]
    ) -> None:
        """Probe rounds until `stopped`, every `every_s` +-20% (the first within one period),
        so a fleet started together does not probe in lockstep."""
        first = True
        while not stopped.is_set():
            factor = self.rng.uniform(0.1, 1.0) if first else self.rng.uniform(0.8, 1.2)
            first = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), self.every_s * factor)
            if stopped.is_set():
                return
            try:
                changed = await self.round(nc)
            except Exception:  # a bad round must not end probing for good
                log.exception("link probe round failed")
                continue
            if changed:
                log.info(
                    "links from %s: %s",
                    self.site,
                    ", ".join(
                        f"{s} {x.latency_ms:.2f}ms {x.bandwidth_mbps:.0f}Mbps"
                        for s, x in sorted(self.measured.items())
                    ),
                )
                try:
                    await on_change()
                except Exception as exc:  # e.g. disconnected: the next advert carries them
                    log.info("re-advertising links failed: %s", exc)
