"""The orchestrator's live view of the cluster, built from adverts and heartbeats."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from statistics import median

from orchestrator.scheduling import Cluster, Device, Link
from schemas.agent import AgentAdvert, DeviceSpec, Heartbeat, LinkSpec

DEFAULT_MISSES = 3


def device_key(agent_id: str, device_id: str) -> str:
    """Cluster-wide device id used inside the scheduler."""
    return f"{agent_id}:{device_id}"


def aggregate_links(adverts: Iterable[AgentAdvert]) -> dict[tuple[str, str], Link]:
    """The site-to-site link model from what agents report: for each (site, to_site), the
    median latency, bandwidth and $/GB over the agents of `site` that report it. Measured
    reports beat declared ones (declared figures count only where nobody measured)."""
    measured: dict[tuple[str, str], list[LinkSpec]] = {}
    declared: dict[tuple[str, str], list[LinkSpec]] = {}
    order: dict[tuple[str, str], None] = {}
    for adv in adverts:
        for link in adv.links:
            pair = (adv.site, link.to_site)
            order[pair] = None
            (measured if link.measured else declared).setdefault(pair, []).append(link)
    out: dict[tuple[str, str], Link] = {}
    for pair in order:
        rs = measured.get(pair) or declared[pair]
        out[pair] = Link(
            latency_s=median(r.latency_ms for r in rs) / 1e3,
            bandwidth_Bps=median(r.bandwidth_mbps for r in rs) * 1e6 / 8,
            cost_per_gb=median(r.cost_per_gb for r in rs),
        )
    return out


@dataclass
class AgentEntry:
    advert: AgentAdvert
    last_seen: float
    running: int = 0
    draining: bool = False
    #: The wire level its adverts name (schemas/wire.py): its offers leave out what it
    #: cannot read.
    wire: int = 1
    #: When it was last heard from (its advert or a heartbeat), kept when health monitoring
    #: says it is dead (`last_seen` then goes to -inf, out of planning): `mars agents` says
    #: how long it has been silent.
    heard: float = field(init=False)

    def __post_init__(self) -> None:
        self.heard = self.last_seen


@dataclass(frozen=True)
class _Snapshot:
    version: int
    live: tuple[AgentEntry, ...]
    ids: tuple[str, ...]
    out: tuple[Cluster, dict[tuple[str, str], Link]]


class ClusterView:
    """Agents by id; an advert from a new incarnation replaces the old one entirely."""

    def __init__(self, misses: int = DEFAULT_MISSES, salt: str = "") -> None:
        self.misses = misses
        #: Orders devices for the scheduler's "lower index wins" ties. Replicas use different
        #: salts, so among equally good devices they prefer different ones and race less.
        self.salt = salt
        self.agents: dict[str, AgentEntry] = {}
        self.stale_dropped = 0
        #: Bumped whenever what an advert says (not just its sequence number) changes.
        self.version = 0
        self._snap: _Snapshot | None = None
        #: The salted order key of each agent id (a hash per agent, made once).
        self._rank: dict[str, bytes] = {}
        #: Each device's advertised spec, by scheduler device id, for the cached snapshot.
        self._specs: tuple[Cluster, dict[str, DeviceSpec]] | None = None
        #: Bumped whenever an agent may have come alive or left (not when one stays alive).
        self._members = 0
        #: The live agents (sorted by id) as of (members, from, until): valid for any `now`
        #: in [from, until), until being the first instant a live agent's heartbeat is late.
        self._live: tuple[int, float, float, tuple[AgentEntry, ...]] | None = None
        #: `warm_models` as of a version.
        self._warm: tuple[int, Mapping[str, list[str]]] = (-1, {})

    def on_advert(self, adv: AgentAdvert, now: float, wire: int = 1) -> bool:
        """Apply an advert (`wire`: the level it was sent with); returns True when it
        introduced a new agent or incarnation."""
        cur = self.agents.get(adv.agent_id)
        if cur is not None and cur.advert.incarnation == adv.incarnation:
            if adv.seq < cur.advert.seq:
                self.stale_dropped += 1
                return False
            if adv.model_copy(update={"seq": cur.advert.seq}) != cur.advert:
                self.version += 1
                self._members += 1
            cur.advert = adv
            cur.wire = wire
            self._seen(cur, now)
            return False
        self.agents[adv.agent_id] = AgentEntry(adv, now, wire=wire)
        self.version += 1
        self._members += 1
        return True

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        cur = self.agents.get(hb.agent_id)
        if cur is None or cur.advert.incarnation != hb.incarnation:
            # unknown or from a previous life: wait for the advert of the current incarnation
            self.stale_dropped += 1
            return
        self._seen(cur, max(cur.last_seen, now))
        cur.running = hb.running
        if cur.draining != hb.draining:
            cur.draining = hb.draining
            self._members += 1

    def _seen(self, entry: AgentEntry, at: float) -> None:
        """A sign of life: it only pushes a live agent's deadline out (the cached live set
        stays right), but may bring one back whose heartbeats were late."""
        if at - entry.last_seen > entry.advert.heartbeat_interval_s * self.misses:
            self._members += 1
        entry.last_seen = at
        entry.heard = max(entry.heard, at)

    def mark_dead(self, agent_id: str, incarnation: str) -> None:
        """Out of planning now (health monitoring says dead), not when its heartbeats lapse."""
        entry = self.agents.get(agent_id)
        if entry is not None and entry.advert.incarnation == incarnation:
            entry.last_seen = float("-inf")
            self._members += 1

    def alive(self, now: float) -> list[AgentEntry]:
        return list(self._alive(now))

    def heard_lately(self, entry: AgentEntry, now: float) -> bool:
        """Its heartbeats are on time and it is not marked dead, whether it takes work or
        drains."""
        return now - entry.last_seen <= entry.advert.heartbeat_interval_s * self.misses

    def _alive(self, now: float) -> tuple[AgentEntry, ...]:
        """Live agents by id; every plan asks, so the set is kept until it can change."""
        got = self._live
        if got is not None and got[0] == self._members and got[1] <= now < got[2]:
            return got[3]
        out = []
        until = math.inf
        for entry in self.agents.values():
            limit = entry.advert.heartbeat_interval_s * self.misses
            if now - entry.last_seen <= limit and not entry.draining:
                out.append(entry)
                until = min(until, entry.last_seen + limit)
        live = tuple(sorted(out, key=lambda e: e.advert.agent_id))
        # `until` is exclusive: at last_seen + limit the agent is still alive, so stop early
        self._live = (self._members, now, until, live)
        return live

    def device_ids(self) -> list[str]:
        """Scheduler ids (`agent:device`) of every device of every known agent, alive or not."""
        return [f"{aid}:{d.device_id}" for aid, e in self.agents.items() for d in e.advert.devices]

    def only_on(self, where: Mapping[str, str]) -> set[tuple[str, str]]:
        """(task, device) pairs that keep each task of `where` on its device (task -> scheduler
        device id), for a re-placement's `exclude`."""
        if not where:
            return set()
        devices = self.device_ids()
        return {(t, d) for t, here in where.items() for d in devices if d != here}

    def device_spec(self, key: str) -> tuple[AgentAdvert, DeviceSpec]:
        agent_id, dev_id = key.split(":", 1)
        adv = self.agents[agent_id].advert
        for d in adv.devices:
            if d.device_id == dev_id:
                return adv, d
        raise KeyError(key)

    def snapshot(self, now: float) -> tuple[Cluster, dict[tuple[str, str], Link]]:
        """A scheduler Cluster of live devices and the site-to-site link table (rebuilt only
        when membership or an advert's content changed)."""
        live = self._alive(now)
        snap = self._snap
        if snap is not None and snap.live is live and snap.version == self.version:
            return snap.out
        ordered = sorted(live, key=lambda e: self._ranked(e.advert.agent_id)) if self.salt else live
        ids = tuple(e.advert.agent_id for e in ordered)
        if snap is not None and snap.version == self.version and snap.ids == ids:
            out = snap.out  # the live set was re-read, and is the same
        else:
            out = self._build(list(ordered))
        self._snap = _Snapshot(self.version, live, ids, out)
        return out

    def _ranked(self, agent_id: str) -> bytes:
        got = self._rank.get(agent_id)
        if got is None:
            if len(self._rank) > 4 * len(self.agents) + 64:  # agents that left long ago
                self._rank.clear()
            got = self._rank[agent_id] = hashlib.blake2b(
                f"{self.salt}/{agent_id}".encode(), digest_size=8
            ).digest()
        return got

    def warm_models(self) -> Mapping[str, list[str]]:
        """Each model an agent's advert names warm (`AgentAdvert.warm_models`): the keys of
        the devices of the agents naming it (dead ones too). Made again only when an advert
        changed (`version`), though every plan of an ONNX task reads it."""
        if self._warm[0] != self.version:
            where: dict[str, list[str]] = {}
            for aid, e in self.agents.items():
                for m in e.advert.warm_models:
                    where.setdefault(m, []).extend(
                        device_key(aid, d.device_id) for d in e.advert.devices
                    )
            self._warm = (self.version, where)
        return self._warm[1]

    def device_specs(self, cluster: Cluster) -> dict[str, DeviceSpec]:
        """The advertised spec of every device of `cluster` (a snapshot of this view), made
        once per snapshot: every plan reads all of them."""
        if self._specs is not None and self._specs[0] is cluster:
            return self._specs[1]
        specs = {d.id: self.device_spec(d.id)[1] for d in cluster.devices}
        if self._snap is not None and self._snap.out[0] is cluster:
            self._specs = (cluster, specs)  # a snapshot's cluster: one advert version
        return specs

    def _build(self, live: list[AgentEntry]) -> tuple[Cluster, dict[tuple[str, str], Link]]:
        devices: list[Device] = []
        for entry in live:
            adv = entry.advert
            for d in adv.devices:
                devices.append(
                    Device(
                        id=device_key(adv.agent_id, d.device_id),
                        agent_id=adv.agent_id,
                        site=adv.site,
                        tier=adv.tier,
                        kind=d.kind,
                        slots=d.slots,
                        memory_mb=d.memory_mb,
                        speed=d.gflops,
                        labels={**adv.labels, **d.labels},
                        cost_per_hour=d.cost_per_hour,
                    )
                )
        return Cluster(devices), aggregate_links(e.advert for e in live)
