"""`mars deploy`: from one sites file, every machine's files.

The output directory holds one bundle per machine role, each laid out as it installs under
the prefix (`/etc/mars` by default), and `secrets/`: the CA's key, every identity's nkey seed
and the link passwords. Generating again keeps what exists (the CA, every key of a name still
in the sites file) and drops what the sites file no longer names, so adding or revoking an
agent is an edit (or `mars deploy add-agent` / `revoke`), a regeneration and a server reload.
"""

from __future__ import annotations

import json
import os
import secrets as pysecrets
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import nkeys

from console.deploy import natsconf, permissions, pki, units
from console.deploy.files import DEFAULT_PREFIX, DEFAULT_STATE
from console.deploy.files import write as _write
from console.deploy.natsconf import Secrets, Tls
from console.deploy.sitesfile import SitesFile
from transport import connect


@dataclass
class Layout:
    """Where a bundle's files will be on its machine. With `prefix` None (a trial on one
    machine), each bundle refers to its own files where they were generated."""

    out: Path
    prefix: str | None = DEFAULT_PREFIX
    state: str | None = DEFAULT_STATE

    def bundle(self, kind: str, name: str) -> Path:
        return self.out / kind / name

    def at(self, bundle: Path, rel: str) -> str:
        if self.prefix is None:
            return str((bundle / rel).resolve())
        return f"{self.prefix}/{rel}"

    def state_dir(self, bundle: Path, rel: str) -> str:
        if self.state is None:
            return str((bundle / "var" / rel).resolve())
        return f"{self.state}/{rel}"


@dataclass
class Generated:
    """What a generation made, for the caller to report."""

    out: Path
    created: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    bundles: list[Path] = field(default_factory=list)


class DeployError(ValueError):
    """Something generation cannot make itself (said to the operator, exit 2)."""


class Vault:
    """`secrets/` of the output: the CA, seeds and passwords, kept across generations."""

    def __init__(self, root: Path, name: str, made: Generated) -> None:
        self.root = root
        self.made = made
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        ca = pki.read(root, "ca")
        #: An operator's own CA: its certificate here without its key. Servers' certificates
        #: are then theirs to bring too (`servers/NAME.pem`, `servers/NAME-key.pem`).
        self.brought = ca is None and (root / "ca.pem").is_file()
        if self.brought:
            ca = pki.KeyCert(b"", (root / "ca.pem").read_bytes())
        if ca is None:
            ca = pki.new_ca(name)
            _write(root / "ca-key.pem", ca.key_pem, secret=True)
            _write(root / "ca.pem", ca.cert_pem)
            made.created.append("CA")
        self.ca = ca
        pw = root / "passwords.json"
        self.passwords: dict[str, str] = json.loads(pw.read_text()) if pw.is_file() else {}

    def seed(self, name: str) -> bytes:
        path = self.root / "seeds" / f"{name}.nk"
        if path.is_file():
            return path.read_bytes().strip()
        seed: bytes = nkeys.encode_seed(pysecrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
        _write(path, seed + b"\n", secret=True)
        self.made.created.append(f"identity {name}")
        return seed

    def forget_seeds(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        seeds = self.root / "seeds"
        for path in sorted(seeds.glob("*.nk")) if seeds.is_dir() else []:
            if path.stem not in keep:
                path.unlink()
                self.made.removed.append(f"identity {path.stem}")

    def password(self, key: str) -> str:
        if key not in self.passwords:
            self.passwords[key] = pysecrets.token_urlsafe(24)
        return self.passwords[key]

    def save(self, keep: Iterable[str]) -> None:
        keep = set(keep)
        self.passwords = {k: v for k, v in self.passwords.items() if k in keep}
        _write(self.root / "passwords.json", json.dumps(self.passwords, indent=1), secret=True)

    def server_cert(self, name: str, hosts: list[str]) -> pki.KeyCert:
        d = self.root / "servers"
        have = pki.read(d, name)
        if have is not None and (self.brought or pki.covers(have, hosts)):
            return have  # (one brought is the operator's to keep valid for its hosts)
        if self.brought:
            raise DeployError(
                f"no certificate for {name} in {d} and no key of the CA in {self.root} "
                f"(a CA you bring): put {name}.pem and {name}-key.pem there, valid for "
                f"{', '.join(hosts)}"
            )
        kc = pki.server_cert(self.ca, name, hosts)
        _write(d / f"{name}-key.pem", kc.key_pem, secret=True)
        _write(d / f"{name}.pem", kc.cert_pem)
        self.made.created.append(f"certificate {name}")
        return kc


def generate(sites: SitesFile, layout: Layout) -> Generated:
    made = Generated(out=layout.out)
    layout.out.mkdir(parents=True, exist_ok=True)
    vault = Vault(layout.out / "secrets", sites.name, made)
    idents = [*sites.replicas(), *sites.agents(), *sites.users, *sites.admins]
    seeds = {n: vault.seed(n) for n in idents}
    vault.forget_seeds(idents)
    pw_keys = ["route", *(f"leaf-{s.name}" for s in sites.sites)]
    sec = Secrets(
        route_password=vault.password("route"),
        leaf_passwords={s.name: vault.password(f"leaf-{s.name}") for s in sites.sites},
        nkeys={n: connect.public_key(sd) for n, sd in seeds.items()},
    )
    vault.save(pw_keys)
    replicas = 3 if len(sites.hub) >= 3 else 1
    hub_urls = ",".join(f"tls://{n.host}:{n.client_port}" for n in sites.hub)
    wanted: set[Path] = set()

    def server_tls(bundle: Path, name: str, hosts: list[str]) -> Tls:
        kc = vault.server_cert(name, hosts)
        _write(bundle / "tls" / "server-key.pem", kc.key_pem, secret=True)
        _write(bundle / "tls" / "server.pem", kc.cert_pem)
        _write(bundle / "tls" / "ca.pem", vault.ca.cert_pem)
        return Tls(
            cert=layout.at(bundle, "tls/server.pem"),
            key=layout.at(bundle, "tls/server-key.pem"),
            ca=layout.at(bundle, "tls/ca.pem"),
        )

    def identity(bundle: Path, name: str, url: str, extra: dict[str, str]) -> None:
        _write(bundle / "identity.nk", seeds[name] + b"\n", secret=True)
        _write(bundle / "tls" / "ca.pem", vault.ca.cert_pem)
        env = {
            "MARS_NATS_URL": url,
            connect.ENV_SEED: layout.at(bundle, "identity.nk"),
            connect.ENV_CA: layout.at(bundle, "tls/ca.pem"),
            connect.ENV_INBOX: permissions.inbox(name),
            connect.ENV_REPLICAS: str(replicas),
            connect.ENV_DOMAIN: permissions.HUB_DOMAIN,
            **extra,
        }
        _write(bundle / "mars.env", "".join(f"{k}={v}\n" for k, v in env.items()), secret=True)

    for node in sites.hub:
        b = layout.bundle("hub", node.name)
        wanted.add(b)
        tls = server_tls(b, node.name, [node.host])
        conf = natsconf.hub_node(sites, node, tls, layout.state_dir(b, "jetstream"), sec)
        _write(b / "nats.conf", natsconf.render(conf), secret=True)
        # the replica beside it reaches the cluster through its own node first
        own = f"tls://{node.host}:{node.client_port}"
        urls = ",".join([own, *(u for u in hub_urls.split(",") if u != own)])
        identity(b / "replica", sites.replicas()[sites.hub.index(node)], urls, {})
        made.bundles.append(b)
    for site in sites.sites:
        b = layout.bundle("sites", site.name)
        wanted.add(b)
        tls = server_tls(b, f"leaf-{site.name}", [site.leaf.host])
        _write(b / "nats.conf", natsconf.render(natsconf.leaf(sites, site, tls, sec)), secret=True)
        made.bundles.append(b)
        for a in site.agents:
            ab = layout.bundle("agents", a)
            wanted.add(ab)
            identity(ab, a, f"tls://{site.leaf.host}:{site.leaf.client_port}", {})
            _agent_yaml(ab, a, site.name, "edge", layout)
            made.bundles.append(ab)
    for a in sites.cloud_agents:
        ab = layout.bundle("agents", a)
        wanted.add(ab)
        identity(ab, a, hub_urls, {})
        _agent_yaml(ab, a, "cloud", "cloud", layout)
        made.bundles.append(ab)
    for u in [*sites.users, *sites.admins]:
        ub = layout.bundle("users", u)
        wanted.add(ub)
        identity(ub, u, hub_urls, {"MARS_USER": u} if u in sites.users else {})
        made.bundles.append(ub)
    units.write(layout.out / "systemd", layout.prefix, layout.state)
    # bundles of names no longer in the sites file go (their seeds went above)
    for kind in ("hub", "sites", "agents", "users"):
        d = layout.out / kind
        for old in sorted(d.iterdir()) if d.is_dir() else []:
            if old not in wanted:
                shutil.rmtree(old)
                made.removed.append(f"{kind}/{old.name}")
    return made


def _agent_yaml(bundle: Path, agent: str, site: str, tier: str, layout: Layout) -> None:
    """A starting agent config (kept once the operator has edited it: hardware is theirs)."""
    path = bundle / "agent.yaml"
    if path.is_file():
        return
    _write(
        path,
        f"# generated once by `mars deploy`; yours to edit (devices, links, allowlists)\n"
        f"agent_id: {agent}\nsite: {site}\ntier: {tier}\nprobe_cpu: true\n"
        f"buffer_dir: {layout.state_dir(bundle, 'agent')}\n",
    )
