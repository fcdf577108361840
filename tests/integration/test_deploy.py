"""`mars deploy` as an operator uses it: generate, add an agent, revoke one, with the
nats-server the generated configs run (one hub node and one leaf site, TLS, nkeys)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nkeys
import pytest
import pytest_asyncio
import yaml
from cryptography import x509
from nats.aio.client import Client as NATS

from console.deploy import sitesfile
from orchestrator.infra.natsserver import find_binary
from tests.topology import Server, env_file, free_ports
from transport.connect import Credentials

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console.cli", "deploy", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


class Deployment:
    def __init__(self, tmp: Path) -> None:
        hub, cluster, leaf_port, site_port = free_ports(4)
        self.tmp, self.out = tmp, tmp / "out"
        self.sites = tmp / "sites.yaml"
        self.sites.write_text(yaml.safe_dump({
            "name": "one",
            "hub": [{"name": "h1", "host": "127.0.0.1", "bind": "127.0.0.1", "client_port": hub,
                     "cluster_port": cluster, "leaf_port": leaf_port, "monitor_port": 0}],
            "sites": [{"name": "a", "agents": ["a1"],
                       "leaf": {"host": "127.0.0.1", "bind": "127.0.0.1",
                                "client_port": site_port, "monitor_port": 0}}],
            "users": ["alice"],
        }))  # fmt: skip
        self.hub = Server("h1", self.out / "hub/h1/nats.conf", hub, tmp / "h1.log")
        self.leaf = Server("leaf-a", self.out / "sites/a/nats.conf", site_port, tmp / "a.log")

    def deploy(self, *args: str) -> str:
        cmd, *rest = args
        done = cli(cmd, str(self.sites), *rest, "-o", str(self.out), "--in-place")
        assert done.returncode == 0, done.stderr
        return done.stdout

    async def connect(self, kind: str, name: str, **kw: Any) -> NATS:
        e = env_file(self.out / kind / name / "mars.env")
        creds = Credentials(e["MARS_NKEY_SEED"], e["MARS_TLS_CA"], e["MARS_INBOX_PREFIX"])
        return await nats.connect(
            e["MARS_NATS_URL"].split(","), allow_reconnect=False, connect_timeout=3,
            **creds.options(), **kw,
        )  # fmt: skip


async def ready(srv: Server) -> None:
    srv.start()
    await srv.wait_logged("Server is ready", time.monotonic() + 10)


@pytest_asyncio.fixture
async def dep(tmp_path: Path) -> AsyncIterator[Deployment]:
    d = Deployment(tmp_path)
    d.deploy("generate")
    await ready(d.hub)
    await ready(d.leaf)
    try:
        yield d
    finally:
        d.leaf.stop()
        d.hub.stop()


def test_generated_configs_are_valid_and_private(tmp_path: Path) -> None:
    d = Deployment(tmp_path)
    out = d.deploy("generate")
    assert "created CA" in out and "created identity a1" in out
    for conf in (d.out / "hub/h1/nats.conf", d.out / "sites/a/nats.conf"):
        check = subprocess.run([find_binary(), "-c", str(conf), "-t"], capture_output=True)
        assert check.returncode == 0, check.stderr
        assert conf.stat().st_mode & 0o077 == 0, "server configs carry passwords"
        assert "no_auth_user" not in conf.read_text()
    seed = d.out / "agents/a1/identity.nk"
    assert seed.stat().st_mode & 0o077 == 0
    assert seed.read_bytes().startswith(b"SU")
    cert = x509.load_pem_x509_certificate((d.out / "hub/h1/tls/server.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    # generating again keeps every key and the CA: nothing to redistribute
    before = seed.read_bytes(), (d.out / "secrets/ca.pem").read_bytes()
    again = d.deploy("generate")
    assert "created" not in again
    assert (seed.read_bytes(), (d.out / "secrets/ca.pem").read_bytes()) == before


def test_sites_file_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "sites.yaml"
    bad.write_text(yaml.safe_dump({"hub": [{"name": "h1", "host": "x"}],
                                   "users": ["u"], "admins": ["u"]}))  # fmt: skip
    done = cli("generate", str(bad), "-o", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "named twice" in done.stderr
    with pytest.raises(sitesfile.SitesFileError, match="cannot read"):
        sitesfile.load(tmp_path / "missing.yaml")


async def test_agent_connects_with_its_identity_only(dep: Deployment) -> None:
    nc = await dep.connect("agents", "a1")
    assert nc.is_connected
    await nc.close()
    # a seed the servers do not know, and no credentials at all: refused, and the server
    # says why in its log
    e = env_file(dep.out / "agents/a1/mars.env")
    stranger = dep.tmp / "stranger.nk"
    stranger.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    creds = Credentials(str(stranger), e["MARS_TLS_CA"], None)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(e["MARS_NATS_URL"], allow_reconnect=False, max_reconnect_attempts=1,
                           connect_timeout=3, **creds.options())  # fmt: skip
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(e["MARS_NATS_URL"], allow_reconnect=False, max_reconnect_attempts=1,
                           connect_timeout=3, tls=creds.options()["tls"])  # fmt: skip
    assert dep.leaf.tail(1 << 20).count("authentication error") >= 2


async def test_revoked_agent_is_cut_off_on_reload(dep: Deployment) -> None:
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    nc = await dep.connect("agents", "a1", closed_cb=on_closed)
    out = dep.deploy("revoke", "a1")
    assert "a1 revoked" in out
    assert not (dep.out / "agents/a1").exists()
    assert "a1" not in yaml.safe_load(dep.sites.read_text())["sites"][0]["agents"]
    assert dep.leaf.proc is not None
    dep.leaf.proc.send_signal(signal.SIGHUP)  # `systemctl reload mars-nats`
    await asyncio.wait_for(closed.wait(), 10)
    await nc.close()


async def test_added_agent_joins_after_reload(dep: Deployment) -> None:
    out = dep.deploy("add-agent", "a9", "--site", "a")
    assert "created identity a9" in out
    assert dep.leaf.proc is not None
    dep.leaf.proc.send_signal(signal.SIGHUP)
    # the reload is applied asynchronously: its log line says when
    await dep.leaf.wait_logged("Reloaded server configuration", time.monotonic() + 10)
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await dep.connect("agents", "a9", error_cb=on_error)
    await nc.publish("mars.v1.agents.a9.hb", b"")
    await nc.flush()
    await nc.close()
    assert not errors


def test_operator_brings_ca_and_certificates(tmp_path: Path) -> None:
    """A CA of the operator's (its certificate without its key) and server certificates it
    signed: used as they are; one missing is asked for by name, nothing made up."""
    for sub in ("theirs", "mine"):
        (tmp_path / sub).mkdir()
    theirs = Deployment(tmp_path / "theirs")
    theirs.deploy("generate")  # stands in for the operator's own PKI
    d = Deployment(tmp_path / "mine")
    d.sites.write_text(theirs.sites.read_text())
    (d.out / "secrets").mkdir(parents=True)
    shutil.copy(theirs.out / "secrets/ca.pem", d.out / "secrets/ca.pem")
    args = ("generate", str(d.sites), "-o", str(d.out), "--in-place")
    missing = cli(*args)
    assert missing.returncode == 2
    assert "no certificate for h1" in missing.stderr and "h1-key.pem" in missing.stderr
    shutil.copytree(theirs.out / "secrets/servers", d.out / "secrets/servers")
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert "created CA" not in done.stdout and "certificate" not in done.stdout
    for bundle, name in (("hub/h1", "h1"), ("sites/a", "leaf-a")):
        served = (d.out / bundle / "tls/server.pem").read_bytes()
        assert served == (theirs.out / f"secrets/servers/{name}.pem").read_bytes()
        assert (d.out / bundle / "tls/ca.pem").read_bytes() == (
            theirs.out / "secrets/ca.pem"
        ).read_bytes()
    assert not (d.out / "secrets/ca-key.pem").exists()
