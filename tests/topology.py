"""A whole secure deployment on loopback, as `mars deploy` generates it: a 3-node hub cluster,
leaf servers for sites, orchestrator replicas and agents as processes, every connection with
TLS and its own nkey. Site uplinks can go through link emulators (sim/linkemu) to be cut."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nats
import yaml
from nats.aio.client import Client as NATS

from console.deploy.generate import Layout, generate
from console.deploy.sitesfile import SitesFile
from orchestrator.infra.natsserver import find_binary, server_env
from orchestrator.infra.procs import stop_all, tied_to_caller
from sim.linkemu import LinkProxy
from tests.harness import agent_process_config
from transport.connect import Credentials

READY_S = 20.0
#: How often a server's log file is looked at while waiting for a line in it.
LOG_POLL_S = 0.025


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (all held open while chosen, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


class Server:
    """One nats-server run from a generated config."""

    def __init__(self, name: str, conf: Path, port: int, log: Path) -> None:
        self.name, self.conf, self.port, self.log = name, conf, port, log
        self.proc: subprocess.Popen[bytes] | None = None
        self._from = 0

    def start(self) -> None:
        self._from = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(
            [find_binary(), "-c", str(self.conf), "-l", str(self.log)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=server_env(1), preexec_fn=tied_to_caller(),
        )  # fmt: skip

    def ready(self) -> bool:
        return self.logged("Server is ready")

    def logged(self, line: str) -> bool:
        """Whether this start of the server has logged `line` (it exiting is an error)."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.tail()}")
        return line in self.tail(1 << 20)

    async def wait_logged(self, line: str, deadline: float) -> None:
        """Until the server logs `line` (its log is a file: polled until `deadline`, a
        `time.monotonic()` instant, then an error with what it did log)."""
        while not self.logged(line):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} never logged {line!r}: {self.tail()}")
            await asyncio.sleep(LOG_POLL_S)

    def tail(self, n: int = 3000) -> str:
        try:
            with self.log.open("rb") as fh:
                fh.seek(self._from)
                return fh.read().decode(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None:
            stop_all([self.proc])


class Topology:
    """`sites`: site -> its agents; `cloud`: agents at the hub. Site `cut_site`'s uplinks go
    through link proxies (`uplinks[site]`, one per hub node)."""

    def __init__(
        self,
        tmp: Path,
        sites: dict[str, list[str]],
        cloud: list[str],
        *,
        users: tuple[str, ...] = ("alice", "bob"),
        admins: tuple[str, ...] = ("ops",),
        proxied: tuple[str, ...] = (),
    ) -> None:
        self.tmp = tmp
        self.out = tmp / "deploy"
        self.proxied = proxied
        self.site_agents = sites
        self.hub_names = ["h1", "h2", "h3"]
        ports = free_ports(3 * len(self.hub_names) + len(sites) + 3 * len(proxied))
        self.hub_ports = {h: (ports.pop(), ports.pop(), ports.pop()) for h in self.hub_names}
        self.leaf_ports = {s: ports.pop() for s in sites}
        self._proxy_ports = ports
        self.uplinks: dict[str, list[LinkProxy]] = {}
        self.servers: dict[str, Server] = {}
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.doc: dict[str, Any] = {
            "name": "test",
            "hub": [
                {"name": h, "host": "127.0.0.1", "bind": "127.0.0.1", "client_port": c,
                 "cluster_port": r, "leaf_port": lp, "monitor_port": 0}
                for h, (c, r, lp) in self.hub_ports.items()
            ],
            "sites": [
                {"name": s, "agents": agents,
                 "leaf": {"host": "127.0.0.1", "bind": "127.0.0.1",
                          "client_port": self.leaf_ports[s], "monitor_port": 0}}
                for s, agents in sites.items()
            ],
            "cloud_agents": cloud,
            "users": list(users),
            "admins": list(admins),
        }  # fmt: skip

    @property
    def sites_file(self) -> Path:
        return self.tmp / "sites.yaml"

    async def start_servers(self) -> None:
        for site in self.proxied:
            proxies = []
            for h in self.hub_names:
                p = LinkProxy(
                    "127.0.0.1", self.hub_ports[h][2], name=f"{site}-{h}",
                    listen_port=self._proxy_ports.pop(),
                )  # fmt: skip
                await p.start()
                proxies.append(p)
            self.uplinks[site] = proxies
            for s in self.doc["sites"]:
                if s["name"] == site:
                    s["leaf"]["uplinks"] = [f"127.0.0.1:{p.port}" for p in proxies]
        self.sites_file.write_text(yaml.safe_dump(self.doc))
        generate(SitesFile.model_validate(self.doc), Layout(self.out, prefix=None, state=None))
        for h in self.hub_names:
            self.servers[h] = Server(
                h, self.out / "hub" / h / "nats.conf", self.hub_ports[h][0], self.tmp / f"{h}.log"
            )
        for s in self.site_agents:
            self.servers[f"leaf-{s}"] = Server(
                f"leaf-{s}", self.out / "sites" / s / "nats.conf", self.leaf_ports[s],
                self.tmp / f"leaf-{s}.log",
            )  # fmt: skip
        for srv in self.servers.values():
            srv.start()
        await self.wait_ready()

    async def wait_ready(self) -> None:
        """Every server ready, and JetStream answering through every site's leaf."""
        deadline = time.monotonic() + READY_S
        for srv in self.servers.values():
            await srv.wait_logged("Server is ready", deadline)
        probes = [("replica", h) for h in self.hub_names] + [
            ("agent", agents[0]) for agents in self.site_agents.values() if agents
        ]
        for kind, name in probes:
            await self.wait_jetstream(kind, name, deadline)

    async def wait_jetstream(self, kind: str, name: str, deadline: float) -> None:
        while True:
            try:
                nc = await self.connect(kind, name)
                try:
                    await self.js(nc).account_info()
                    return
                finally:
                    await nc.close()
            except Exception as exc:  # not elected yet, leaf not linked yet
                if time.monotonic() > deadline:
                    raise RuntimeError(f"JetStream not reachable as {kind} {name}: {exc}") from exc
                await asyncio.sleep(0.1)

    def bundle(self, kind: str, name: str) -> Path:
        if kind == "replica":
            return self.out / "hub" / name / "replica"
        return self.out / {"agent": "agents", "user": "users"}[kind] / name

    def env(self, kind: str, name: str) -> dict[str, str]:
        return env_file(self.bundle(kind, name) / "mars.env")

    async def connect(self, kind: str, name: str, **kw: Any) -> NATS:
        e = self.env(kind, name)
        creds = Credentials(e["MARS_NKEY_SEED"], e["MARS_TLS_CA"], e["MARS_INBOX_PREFIX"])
        kw.setdefault("allow_reconnect", False)
        return await nats.connect(e["MARS_NATS_URL"].split(","), **creds.options(), **kw)

    @staticmethod
    def js(nc: NATS) -> Any:
        return nc.jetstream(domain="hub")

    def process_env(self, kind: str, name: str) -> dict[str, str]:
        return {**os.environ, **self.env(kind, name)}

    async def start_replica(self, hub: str, *extra: str) -> asyncio.subprocess.Process:
        e = self.process_env("replica", hub)
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "orchestrator", "--nats", e["MARS_NATS_URL"],
            "--retry-connect", *extra, env=e,
        )  # fmt: skip
        self.procs[f"orch-{hub}"] = p
        return p

    async def start_agent(self, name: str, **config: Any) -> asyncio.subprocess.Process:
        site = next((s for s, a in self.site_agents.items() if name in a), None)
        cfg = agent_process_config(
            self.tmp, name, tier="edge" if site else "cloud", site=site or "cloud", **config
        )
        e = self.process_env("agent", name)
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "agent", "--nats", e["MARS_NATS_URL"],
            "--config", str(cfg), "--id", name, "--grace", "0", env=e,
        )  # fmt: skip
        self.procs[name] = p
        return p

    async def close(self) -> None:
        for p in self.procs.values():
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                await p.wait()
        for srv in self.servers.values():
            srv.stop()
        for proxies in self.uplinks.values():
            for px in proxies:
                await px.stop()
