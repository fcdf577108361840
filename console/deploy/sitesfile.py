"""The sites file: one YAML file that says what a deployment is (hub nodes, sites, agents,
users), from which `mars deploy` generates everything each machine needs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.limits import Ident, ShortText

Port = Annotated[int, Field(ge=1, le=65535)]
Names = Annotated[list[Ident], Field(max_length=10_000)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HubNode(_Strict):
    """One nats-server of the hub cluster; an orchestrator replica runs beside it."""

    name: Ident
    #: Address agents, replicas and leaf servers reach it at (also in its certificate).
    host: ShortText
    #: The address it listens on (all interfaces by default).
    bind: ShortText = "0.0.0.0"
    client_port: Port = 4222
    cluster_port: Port = 6222
    leaf_port: Port = 7422
    #: The server's HTTP monitoring port (bound to loopback on the node), 0: none.
    monitor_port: Annotated[int, Field(ge=0, le=65535)] = 8222


class Leaf(_Strict):
    """A site's own nats-server: its agents connect here; it joins the hub as a leaf node."""

    host: ShortText
    bind: ShortText = "0.0.0.0"
    client_port: Port = 4222
    monitor_port: Annotated[int, Field(ge=0, le=65535)] = 8222
    #: `host:port` the leaf dials for the hub's leaf port, one per hub node in order, when it
    #: must go another way than the nodes' own addresses (a NAT, a WAN proxy).
    uplinks: Annotated[list[ShortText], Field(max_length=15)] = Field(default_factory=list)


class Site(_Strict):
    name: Ident
    leaf: Leaf
    agents: Names = Field(default_factory=list)


class SitesFile(_Strict):
    #: The deployment's name: the hub cluster's name, the CA's common name.
    name: Ident = "mars"
    hub: Annotated[list[HubNode], Field(min_length=1, max_length=15)]
    sites: Annotated[list[Site], Field(max_length=1000)] = Field(default_factory=list)
    #: Agents that connect straight to the hub (cloud machines beside it).
    cloud_agents: Names = Field(default_factory=list)
    #: People and scripts that submit pipelines: each sees and cancels only its own.
    users: Names = Field(default_factory=list)
    #: Operators: every pipeline, artifacts, the fleet.
    admins: Names = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> SitesFile:
        seen: dict[str, str] = {}
        groups: list[tuple[str, list[str]]] = [
            ("hub node", [n.name for n in self.hub]),
            ("site", [s.name for s in self.sites]),
            ("agent", [a for s in self.sites for a in s.agents] + list(self.cloud_agents)),
            ("user", list(self.users) + list(self.admins)),
        ]
        for what, names in groups:
            for name in names:
                key = f"{what}:{name}"
                if key in seen:
                    raise ValueError(f"{what} {name!r} is named twice")
                seen[key] = what
        hubs = {n.name for n in self.hub}
        replicas = {replica_name(h) for h in hubs}
        clash = replicas & (set(self.users) | set(self.admins) | set(self.agents()))
        if clash:
            raise ValueError(f"names reserved for replicas: {sorted(clash)}")
        return self

    def agents(self) -> list[str]:
        return [a for s in self.sites for a in s.agents] + list(self.cloud_agents)

    def site_of(self, agent: str) -> Site | None:
        for s in self.sites:
            if agent in s.agents:
                return s
        return None

    def replicas(self) -> list[str]:
        return [replica_name(n.name) for n in self.hub]


def replica_name(hub_node: str) -> str:
    return f"orch-{hub_node}"


class SitesFileError(ValueError):
    pass


def load(path: Path) -> SitesFile:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SitesFileError(f"cannot read {path}: {exc}") from exc
    try:
        return SitesFile.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        raise SitesFileError(f"{path}: {exc}") from exc


def dump(sites: SitesFile, path: Path) -> None:
    data = sites.model_dump(mode="json", exclude_none=True, exclude_defaults=False)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
