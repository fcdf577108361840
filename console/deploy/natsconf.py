"""nats-server configuration of hub nodes and site leaf servers, as data (written as JSON,
which nats-server reads as its own configuration format)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from console.deploy import permissions
from console.deploy.sitesfile import HubNode, Site, SitesFile
from schemas import presence
from schemas.limits import MAX_PAYLOAD_BYTES

#: Connections a server allows per identity it knows, and on top (operators' tools, reloads).
CONNS_PER_IDENTITY = 8
CONNS_SPARE = 64
APP = "APP"
SYS = "SYS"


@dataclass(frozen=True)
class Tls:
    """Where one server's certificate, key and the CA are on its machine."""

    cert: str
    key: str
    ca: str

    def block(self, *, verify: bool = False) -> dict[str, Any]:
        b: dict[str, Any] = {
            "cert_file": self.cert,
            "key_file": self.key,
            "ca_file": self.ca,
            "timeout": 5,
        }
        if verify:
            b["verify"] = True
        return b


@dataclass(frozen=True)
class Secrets:
    """What the server configs carry that must stay secret: link passwords, users' nkeys."""

    route_password: str
    #: site -> password of its leaf connection into the application and system accounts.
    leaf_passwords: dict[str, str]
    #: identity name -> public nkey (U...).
    nkeys: dict[str, str]


def _users(names_perms: list[tuple[str, dict[str, Any]]], s: Secrets) -> list[dict[str, Any]]:
    return [{"nkey": s.nkeys[n], "permissions": p} for n, p in names_perms]


def _accounts(users: list[dict[str, Any]], *, jetstream: bool) -> dict[str, Any]:
    app: dict[str, Any] = {
        "users": users,
        # an agent's connection closing is heard at once (docs/recovery.md)
        "imports": [{"stream": {"account": SYS, "subject": f"$SYS.ACCOUNT.{APP}.>"}}],
    }
    if jetstream:
        app["jetstream"] = "enabled"
    return {SYS: {"exports": [{"stream": f"$SYS.ACCOUNT.{APP}.>"}]}, APP: app}


def _max_conns(identities: int) -> int:
    """A server's bound on connections: a few per identity it knows. An identity opening
    connections in a loop exhausts its own server's allowance at worst (a site's flood stays
    at its leaf), never the hub's file descriptors."""
    return CONNS_PER_IDENTITY * identities + CONNS_SPARE


def _common(name: str, bind: str, port: int, monitor: int, tls: Tls) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "server_name": name,
        "listen": f"{bind}:{port}",
        "max_payload": MAX_PAYLOAD_BYTES,
        # a connection that stops answering is closed (a DISCONNECT advisory): silent links
        "ping_interval": presence.PING_INTERVAL,
        "ping_max": presence.PING_MAX,
        "tls": tls.block(),
        "system_account": SYS,  # no `no_auth_user`: every client has an identity
    }
    if monitor:
        conf["http"] = f"127.0.0.1:{monitor}"
    return conf


def hub_node(
    sites: SitesFile, node: HubNode, tls: Tls, store_dir: str, s: Secrets
) -> dict[str, Any]:
    users = _users(
        [(r, permissions.replica(r)) for r in sites.replicas()]
        + [(a, permissions.agent(a)) for a in sites.cloud_agents]
        + [(u, permissions.user(u)) for u in sites.users]
        + [(a, permissions.admin(a)) for a in sites.admins],
        s,
    )
    conf = _common(node.name, node.bind, node.client_port, node.monitor_port, tls)
    conf["accounts"] = _accounts(users, jetstream=True)
    conf["max_connections"] = _max_conns(len(users) + 2 * len(sites.sites))
    conf["jetstream"] = {
        "store_dir": store_dir,
        # an acknowledged write is on disk: a node lost at once loses nothing it acked
        "sync_interval": "always",
        # leaf sites reach it through the domain (`$JS.hub.API`); they have none of their own
        "domain": permissions.HUB_DOMAIN,
    }
    if len(sites.hub) > 1:
        conf["cluster"] = {
            "name": sites.name,
            "listen": f"{node.bind}:{node.cluster_port}",
            "authorization": {"user": "route", "password": s.route_password},
            "routes": [
                f"nats-route://route:{s.route_password}@{o.host}:{o.cluster_port}"
                for o in sites.hub
                if o.name != node.name
            ],
            "tls": tls.block(verify=True),
        }
    leaf_users: list[dict[str, Any]] = []
    for site in sites.sites:
        pw = s.leaf_passwords[site.name]
        leaf_users.append({"user": f"leaf-{site.name}", "password": pw, "account": APP})
        leaf_users.append({"user": f"leaf-{site.name}-sys", "password": pw, "account": SYS})
    if leaf_users:
        conf["leafnodes"] = {
            "listen": f"{node.bind}:{node.leaf_port}",
            "tls": tls.block(),
            "authorization": {"users": leaf_users},
        }
    return conf


def leaf(sites: SitesFile, site: Site, tls: Tls, s: Secrets) -> dict[str, Any]:
    """A site's server: its agents' identities and permissions, no JetStream of its own (the
    hub's answers through the leaf connection), the site's traffic kept at the site."""
    users = _users([(a, permissions.agent(a)) for a in site.agents], s)
    conf = _common(
        f"leaf-{site.name}", site.leaf.bind, site.leaf.client_port, site.leaf.monitor_port, tls
    )
    conf["accounts"] = _accounts(users, jetstream=False)
    conf["max_connections"] = _max_conns(len(users))
    pw = s.leaf_passwords[site.name]

    ends = site.leaf.uplinks or [f"{n.host}:{n.leaf_port}" for n in sites.hub]

    def remote(user: str, account: str) -> dict[str, Any]:
        return {
            "urls": [f"tls://{user}:{pw}@{end}" for end in ends],
            "account": account,
            "tls": {"ca_file": tls.ca, "cert_file": tls.cert, "key_file": tls.key},
        }

    conf["leafnodes"] = {
        "reconnect": "1s",
        "remotes": [
            remote(f"leaf-{site.name}", APP),
            # the site's connection advisories reach the replicas at the hub
            remote(f"leaf-{site.name}-sys", SYS),
        ],
    }
    return conf


def render(conf: dict[str, Any]) -> str:
    return "# generated by `mars deploy`; edit the sites file instead\n" + json.dumps(
        conf, indent=2
    )
