"""Who a MARS process is on NATS, and how it checks the server: one place for credentials.

In a deployment made by `mars deploy` every agent, replica, user and admin has its own nkey
(a seed file only it reads) and verifies the servers' TLS certificates against the site's CA.
The generated `mars.env` of each identity says where those files are:

- `MARS_NKEY_SEED`: the identity's nkey seed file (the server knows only its public key);
- `MARS_TLS_CA`: the CA certificate the server's certificate must chain to;
- `MARS_INBOX_PREFIX`: the identity's own reply subjects, the only ones it may subscribe to
  (nobody else can read the replies it is sent);
- `MARS_JS_REPLICAS`: replicas of the streams and buckets MARS creates (3 on a hub cluster);
- `MARS_JS_DOMAIN`: the hub's JetStream domain, through which a client at a site's leaf
  server reaches the hub's JetStream (a leaf has none of its own).

None of them set: the open single-machine server (`mars demo`, tests) on loopback.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

ENV_SEED = "MARS_NKEY_SEED"
ENV_CA = "MARS_TLS_CA"
ENV_INBOX = "MARS_INBOX_PREFIX"
ENV_REPLICAS = "MARS_JS_REPLICAS"
ENV_DOMAIN = "MARS_JS_DOMAIN"


class CredentialsError(ValueError):
    """A credential file named that cannot be used (missing, unreadable, not a seed)."""


@dataclass(frozen=True)
class Credentials:
    nkey_seed: str | None = None
    tls_ca: str | None = None
    inbox_prefix: str | None = None

    @classmethod
    def from_env(
        cls,
        *,
        nkey_seed: str | None = None,
        tls_ca: str | None = None,
        inbox_prefix: str | None = None,
    ) -> Credentials:
        """Flags first, then the environment (`mars.env` of a deployment)."""
        made = cls(
            nkey_seed=nkey_seed or os.environ.get(ENV_SEED) or None,
            tls_ca=tls_ca or os.environ.get(ENV_CA) or None,
            inbox_prefix=inbox_prefix or os.environ.get(ENV_INBOX) or None,
        )
        made.check()
        return made

    def check(self) -> None:
        """Refuse files that cannot work now, with their path, rather than at every reconnect."""
        for what, path in (("nkey seed", self.nkey_seed), ("TLS CA", self.tls_ca)):
            if path is not None and not Path(path).is_file():
                raise CredentialsError(f"{what} file {path} does not exist or is not a file")
        if self.nkey_seed is not None:
            try:
                head = Path(self.nkey_seed).read_bytes()[:2]
            except OSError as exc:
                raise CredentialsError(f"cannot read nkey seed {self.nkey_seed}: {exc}") from exc
            if head != b"SU":
                raise CredentialsError(f"{self.nkey_seed} is not a user nkey seed (SU...)")

    @property
    def secure(self) -> bool:
        return self.nkey_seed is not None

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `nats.connect`."""
        opts: dict[str, Any] = {}
        if self.nkey_seed is not None:
            opts["nkeys_seed"] = self.nkey_seed
        if self.tls_ca is not None:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            opts["tls"] = ctx
        if self.inbox_prefix is not None:
            opts["inbox_prefix"] = self.inbox_prefix
        return opts


def js_replicas() -> int:
    """Replicas of what MARS creates in JetStream: `MARS_JS_REPLICAS`, else 1."""
    try:
        n = int(os.environ.get(ENV_REPLICAS, "1"))
    except ValueError:
        return 1
    return n if n in (1, 3, 5) else 1


def options() -> dict[str, Any]:
    """`nats.connect` keyword arguments of this process's identity (the environment's)."""
    return Credentials.from_env().options()


def servers(url: str) -> list[str]:
    """A URL or several, comma-separated (a hub cluster's nodes): nats-py takes a list."""
    return [u.strip() for u in url.split(",") if u.strip()]


def jetstream(nc: Any) -> Any:
    """The JetStream context of a connection: the hub's domain when one is set."""
    domain = os.environ.get(ENV_DOMAIN) or None
    return nc.jetstream(domain=domain) if domain else nc.jetstream()


def public_nkey() -> str | None:
    """The public key of this process's nkey seed (`MARS_NKEY_SEED`), None without one."""
    seed = os.environ.get(ENV_SEED)
    if not seed:
        return None
    try:
        return public_key(Path(seed).read_bytes().strip())
    except (OSError, nkeys.NkeysError):
        return None


def public_key(seed: bytes) -> str:
    """The public nkey (U...) of a user seed (SU...)."""
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode())
