"""Topology files (YAML): sites with a tier, links between sites, agents with their devices.

Why a file: the same description drives the fleet launcher (`mars sim up`: real processes
behind emulated links) and can drive the simulator, so an experiment is one reviewable file.

Network model used by the launcher (a simplification, documented in docs/sim.md): everything
an agent sends goes through the one NATS server at the **hub** site, so each agent sits behind
one emulated link, its **access path** = its site's LAN, then its site's uplink to the hub
(the declared link between the site and the hub, else the tier's default uplink). Traffic
between agents at sites A and B therefore crosses access(A) then access(B); a link declared
directly between two non-hub sites is kept in the file but is *not* emulated (the launcher
says so). Declared `LinkSpec`s in generated agent configs are these emulated paths, so what
the scheduler is told matches what the agents' link probes will measure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.agent import DeviceKind, DeviceSpec, LinkSpec, Tier
from schemas.limits import Ident, Labels, ShortText
from sim.linkemu import LinkProfile
from sim.tiers import LINK_PRESETS, TIER_PRESETS, link_preset

MAX_AGENTS = 1000
#: Bandwidth declared for a path the emulator leaves unlimited (LinkSpec needs a number):
#: a datacentre fabric, 10 Gbit/s.
UNLIMITED_MBPS = 10_000.0

Ms = Annotated[float, Field(ge=0.0, le=600_000.0, allow_inf_nan=False)]


class LinkParams(BaseModel):
    """A preset, explicit figures, or a preset with some figures overridden."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = None
    latency_ms: Ms | None = None
    jitter_ms: Ms | None = None
    bandwidth_mbps: Annotated[float, Field(gt=0.0, le=1e7, allow_inf_nan=False)] | None = None
    loss: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None

    @model_validator(mode="after")
    def _known_preset(self) -> LinkParams:
        if self.preset is not None and self.preset not in LINK_PRESETS:
            raise ValueError(f"unknown link preset {self.preset!r} (known: {sorted(LINK_PRESETS)})")
        if self.preset is None and self.latency_ms is None:
            raise ValueError("a link needs a preset or latency_ms")
        return self

    def profile(self) -> LinkProfile:
        base = link_preset(self.preset) if self.preset else LINK_PRESETS["none"]
        return LinkProfile(
            latency_ms=base.latency_ms if self.latency_ms is None else self.latency_ms,
            jitter_ms=base.jitter_ms if self.jitter_ms is None else self.jitter_ms,
            bandwidth_mbps=base.bandwidth_mbps
            if self.bandwidth_mbps is None
            else self.bandwidth_mbps,
            loss=base.loss if self.loss is None else self.loss,
        )


def _preset_shorthand(v: Any) -> Any:
    """`lan: wan` means `lan: {preset: wan}`."""
    return {"preset": v} if isinstance(v, str) else v


class SiteDef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Ident
    tier: Tier
    #: Link from each agent to this site's network (default: the tier's, see sim.tiers).
    lan: LinkParams | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "lan" in data:
            data = {**data, "lan": _preset_shorthand(data["lan"])}
        return data


class LinkDef(LinkParams):
    between: tuple[Ident, Ident]


class DeviceDef(BaseModel):
    """An emulated device: declared, never measured. `count` > 1 makes KIND0, KIND1, ..."""

    model_config = ConfigDict(extra="forbid")

    device_id: Ident | None = None
    kind: DeviceKind = "cpu"
    count: Annotated[int, Field(ge=1, le=64)] = 1
    slots: Annotated[int, Field(ge=1, le=1024)] | None = None
    #: Declared GFLOP/s (default: the tier preset's).
    gflops: Annotated[float, Field(gt=0.0, le=1e9)] | None = None
    memory_mb: Annotated[float, Field(ge=0.0, le=1e9)] = 0.0
    cost_per_hour: Annotated[float, Field(ge=0.0, le=1e6)] = 0.0
    model_name: ShortText = ""
    labels: Labels = Field(default_factory=dict)


class AgentDef(BaseModel):
    """One agent, or `replicas` alike ones named ID-0, ID-1, ..."""

    model_config = ConfigDict(extra="forbid")

    id: Ident
    site: Ident
    replicas: Annotated[int, Field(ge=1, le=MAX_AGENTS)] = 1
    devices: list[DeviceDef] = Field(default_factory=list)
    labels: Labels = Field(default_factory=dict)
    #: Extra AgentConfig fields (validated when the config is generated).
    config: dict[str, Any] = Field(default_factory=dict)


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Ident
    description: ShortText = ""
    #: Site of the NATS server and the orchestrator (default: the first cloud site, else the
    #: first site).
    hub: Ident | None = None
    sites: Annotated[list[SiteDef], Field(min_length=1, max_length=256)]
    links: list[LinkDef] = Field(default_factory=list)
    agents: Annotated[list[AgentDef], Field(min_length=1)]
    heartbeat_interval_s: Annotated[float, Field(gt=0.0, le=60.0)] = 0.5
    #: Let agents measure the emulated links themselves (seconds between rounds; 0: off).
    link_probe_every_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 10.0
    #: Seed of the emulator's jitter and loss draws.
    seed: int = 0

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate site names in {names}")
        known = set(names)
        if self.hub is not None and self.hub not in known:
            raise ValueError(f"hub {self.hub!r} is not a site")
        pairs: set[frozenset[str]] = set()
        for link in self.links:
            a, b = link.between
            if a not in known or b not in known:
                raise ValueError(f"link {a}<->{b} names an unknown site")
            if a == b:
                raise ValueError(f"link {a}<->{b} joins a site to itself (use the site's lan)")
            if frozenset((a, b)) in pairs:
                raise ValueError(f"link {a}<->{b} declared twice")
            pairs.add(frozenset((a, b)))
        for agent in self.agents:
            if agent.site not in known:
                raise ValueError(f"agent {agent.id!r} is at unknown site {agent.site!r}")
        ids = [aid for aid, _ in self.expanded_agents()]
        if len(ids) > MAX_AGENTS:
            raise ValueError(f"{len(ids)} agents; at most {MAX_AGENTS}")
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"duplicate agent ids after expanding replicas: {dup}")
        return self

    # -- sites and links ---------------------------------------------------------------------
    @property
    def hub_site(self) -> str:
        if self.hub is not None:
            return self.hub
        clouds = [s.name for s in self.sites if s.tier == "cloud"]
        return clouds[0] if clouds else self.sites[0].name

    def site(self, name: str) -> SiteDef:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(name)

    def link(self, a: str, b: str) -> LinkProfile | None:
        """The link declared between two sites (either order), if any."""
        for link in self.links:
            if set(link.between) == {a, b}:
                return link.profile()
        return None

    def lan(self, site: str) -> LinkProfile:
        s = self.site(site)
        if s.lan is not None:
            return s.lan.profile()
        return LinkParams(preset=TIER_PRESETS[s.tier].lan).profile()

    def uplink(self, site: str) -> LinkProfile:
        """Site -> hub: the declared link, else the tier's default uplink; none at the hub."""
        if site == self.hub_site:
            return LinkProfile()
        declared = self.link(site, self.hub_site)
        if declared is not None:
            return declared
        return LinkParams(preset=TIER_PRESETS[self.site(site).tier].uplink).profile()

    def access(self, site: str) -> LinkProfile:
        """What the emulator puts between an agent of `site` and the NATS server."""
        return self.lan(site).then(self.uplink(site))

    def path(self, a: str, b: str) -> LinkProfile:
        """One way from an agent at `a` to one at `b`, as emulated (through the hub)."""
        return self.access(a).then(self.access(b))

    def unemulated_links(self) -> list[tuple[str, str]]:
        """Declared links the star-through-the-hub emulation cannot honour."""
        hub = self.hub_site
        return [link.between for link in self.links if hub not in link.between]

    # -- agents ------------------------------------------------------------------------------
    def expanded_agents(self) -> list[tuple[str, AgentDef]]:
        out: list[tuple[str, AgentDef]] = []
        for agent in self.agents:
            if agent.replicas == 1:
                out.append((agent.id, agent))
            else:
                out.extend((f"{agent.id}-{k}", agent) for k in range(agent.replicas))
        return out

    def devices(self, agent: AgentDef) -> list[DeviceSpec]:
        tier = TIER_PRESETS[self.site(agent.site).tier]
        defs = agent.devices or [DeviceDef()]
        out: list[DeviceSpec] = []
        per_kind: dict[str, int] = {}
        for d in defs:
            for _ in range(d.count):
                k = per_kind.get(d.kind, 0)
                per_kind[d.kind] = k + 1
                device_id = d.device_id if d.count == 1 and d.device_id else f"{d.kind}{k}"
                out.append(
                    DeviceSpec(
                        device_id=device_id,
                        kind=d.kind,
                        slots=d.slots or (tier.slots if d.kind == "cpu" else 1),
                        gflops=d.gflops or tier.gflops,
                        memory_mb=d.memory_mb,
                        cost_per_hour=d.cost_per_hour,
                        emulated=True,
                        model_name=d.model_name or f"emulated {tier.name} {d.kind} (sim topology)",
                        labels={"mars/emulated": "true", **d.labels},
                    )
                )
        ids = [d.device_id for d in out]
        if len(set(ids)) != len(ids):
            raise ValueError(f"agent {agent.id!r}: duplicate device ids {ids}")
        return out

    def declared_links(self, site: str) -> list[LinkSpec]:
        """Link costs to every other site, as the emulator will impose them."""
        out = []
        for other in self.sites:
            if other.name == site:
                continue
            p = self.path(site, other.name)
            out.append(
                LinkSpec(
                    to_site=other.name,
                    latency_ms=p.latency_ms,
                    bandwidth_mbps=p.bandwidth_mbps or UNLIMITED_MBPS,
                    jitter_ms=p.jitter_ms,
                )
            )
        return out

    def agent_config(self, agent: AgentDef) -> dict[str, Any]:
        """The YAML body of an agent's config (an `edge_agent.config.AgentConfig`)."""
        site = self.site(agent.site)
        body: dict[str, Any] = {
            "site": site.name,
            "tier": site.tier,
            "labels": {"mars/sim-topology": self.name, **agent.labels},
            # emulated devices only: this host's CPU/GPUs must not be advertised N times
            "probe_cpu": False,
            "probe_gpus": False,
            "probe_accelerators": False,
            "recalibrate_every_s": 0.0,
            "heartbeat_interval_s": self.heartbeat_interval_s,
            "link_probe_every_s": self.link_probe_every_s,
            "shutdown_grace_s": 2.0,
            "devices": [d.model_dump(mode="json") for d in self.devices(agent)],
            "links": [link.model_dump(mode="json") for link in self.declared_links(site.name)],
        }
        body.update(agent.config)
        return body


def load_topology(path: str | Path) -> Topology:
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a topology must be a mapping")
    return Topology.model_validate(raw)


def example_path(name: str = "small.yaml") -> Path:
    return Path(__file__).resolve().parent / "topologies" / name
