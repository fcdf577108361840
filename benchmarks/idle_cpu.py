"""Idle CPU of one orchestrator replica beside a fleet of emulated agents: what presence costs.

    python -m benchmarks.idle_cpu [--agents 1000,10000] [--window 15] [--windows 3]
                                  [--old-heartbeat 0.5] [--old-agents 1000] [--agent-procs 10]

For each fleet size, one embedded nats-server (its pings as MARS configures them), one
orchestrator replica (`mars orchestrator`, a process of its own) and `--agent-procs` processes
of `mars sim agents` sharing the fleet, started one after another: real agents with emulated
devices, spread over 10 sites, each process's agents on one shared NATS connection
(`edge_agent.sharedconn`; so no per-agent pings, which cost the server, not the replica).
Nothing is submitted. Once every agent has advertised and the fleet has settled (two heartbeat
intervals, at least 10 s), the replica's CPU time (user + system) is read over `--windows`
windows of `--window` seconds: the table gives the least and the median window, as % of one
core. Also read over the same windows: the messages the server delivered to the replica (per
second) and the CPU of the nats-server and of the agent processes.

Each size is measured at the default heartbeat interval; the baseline, in the same run on the
same machine, is the old setting (`--old-heartbeat`, the default before presence moved to the
server's pings: every replica decoded every agent's heartbeat twice a second) at the
`--old-agents` sizes (1,000 by default: on a 2-core machine 10,000 agents at the old setting
saturate the machine itself, the agents' processes more than the replica, and what would be
measured is that). The message-rate column says what the replica really received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nats
import psutil
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from benchmarks.booking_stress import Services, api_instances
from benchmarks.common import counts, progress, table
from benchmarks.placement_latency import shares
from edge_agent.config import AgentConfig
from orchestrator.infra import eventloop
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.infra.procs import terminate_as_interrupt
from schemas import subjects
from schemas.presence import PING_INTERVAL, PING_MAX

SITES = 10
READY_TIMEOUT_S = 600.0
ORCHESTRATOR_CLIENT = "mars-orchestrator"


@dataclass
class Measured:
    heartbeat_s: float
    agents: int
    replica_pct: list[float]
    replica_msgs_s: list[float]
    server_pct: list[float]
    agents_pct: list[float]
    start_s: float
    load: tuple[float, float, float]


async def api_instances_at(url: str) -> int:
    nc = await nats.connect(url, name="mars-bench")
    try:
        return await api_instances(nc)
    finally:
        await nc.close()


def cpu_model() -> str:
    """The CPU's model name (Linux), else the machine type."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def agent_procs_for(agents: int, procs: int) -> int:
    """Processes the fleet is spread over: at most one per site, at least one."""
    return max(1, min(procs, SITES, agents))


class Adverts:
    """Agents that have advertised, counted by subject (an agent id once each)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.changed = asyncio.Event()
        self.nc: NATS | None = None

    async def start(self, url: str) -> None:
        self.nc = await nats.connect(url, name="mars-bench")
        await self.nc.subscribe(subjects.ALL_ADVERTS, cb=self._on)
        await self.nc.flush()

    async def _on(self, msg: Msg) -> None:
        self.seen.add(msg.subject.split(".")[3])
        self.changed.set()

    async def until(self, prefix: str, count: int, services: Services) -> None:
        """Until `count` agents whose ids start with `prefix` have advertised."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while (n := sum(1 for a in self.seen if a.startswith(prefix))) < count:
            services.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {n} of {count} agents {prefix}* advertised")
            self.changed.clear()
            await eventloop.wait_event(self.changed, 5.0)

    async def stop(self) -> None:
        if self.nc is not None:
            await self.nc.close()


async def measure(
    agents: int, heartbeat_s: float, args: argparse.Namespace, logdir: Path
) -> Measured:
    progress(f"{agents} emulated agents, heartbeat {heartbeat_s:g} s: starting")
    server = EmbeddedNats(store_dir=str(logdir / f"nats-{agents}-{heartbeat_s:g}"), monitor=True)
    server.start()
    began = time.monotonic()
    try:
        with Services(logdir) as services:
            services.spawn("orchestrator", ["orchestrator", "--nats", server.url])
            procs = agent_procs_for(agents, args.agent_procs)
            per_proc = shares(SITES, procs)
            adverts = Adverts()
            await adverts.start(server.url)
            try:
                # one agent process after another: on a small machine, agents starting all at
                # once beside the heartbeats of those up already time out on their first flush
                for k, count in enumerate(shares(agents, procs)):
                    state = logdir / f"agents-{agents}-{heartbeat_s:g}"
                    argv = ["sim", "agents", "--nats", server.url, "--count", str(count),
                            "--prefix", f"f{k}", "--site-count", str(per_proc[k]),
                            "--heartbeat", str(heartbeat_s), "--shared-connection",
                            "--state-dir", str(state)]  # fmt: skip
                    services.spawn(f"agents-{agents}-{heartbeat_s:g}-{k}", argv)
                    await adverts.until(f"f{k}-", count, services)
                    progress(f"  {len(adverts.seen)}/{agents} agents advertised")
            finally:
                await adverts.stop()
            while await api_instances_at(server.url) < 1:
                services.check()
            start_s = time.monotonic() - began
            settle = max(10.0, 2 * heartbeat_s)
            progress(f"  all joined after {start_s:.0f} s; settling {settle:.0f} s")
            await asyncio.sleep(settle)
            assert server.proc is not None
            replica = psutil.Process(services.procs[0].pid)
            nats_proc = psutil.Process(server.proc.pid)
            fleet = [psutil.Process(p.pid) for p in services.procs[1:]]
            out = Measured(heartbeat_s, agents, [], [], [], [], start_s, os.getloadavg())
            for w in range(args.windows):
                services.check()
                t0, r0, s0 = time.monotonic(), cpu_s(replica), cpu_s(nats_proc)
                a0 = sum(cpu_s(p) for p in fleet)
                m0 = (await asyncio.to_thread(server.traffic)).get(ORCHESTRATOR_CLIENT, (0, 0))
                await asyncio.sleep(args.window)
                m1 = (await asyncio.to_thread(server.traffic)).get(ORCHESTRATOR_CLIENT, (0, 0))
                dt = time.monotonic() - t0
                out.replica_pct.append(100 * (cpu_s(replica) - r0) / dt)
                out.server_pct.append(100 * (cpu_s(nats_proc) - s0) / dt)
                out.agents_pct.append(100 * (sum(cpu_s(p) for p in fleet) - a0) / dt)
                # (counted per connection: a replica that reconnected has no figure)
                got = m1[1] - m0[1]
                out.replica_msgs_s.append(got / dt if got >= 0 else math.nan)
                progress(
                    f"  window {w + 1}/{args.windows}: replica {out.replica_pct[-1]:.1f} % of a "
                    f"core, {out.replica_msgs_s[-1]:,.0f} msgs/s to it"
                )
            return out
    finally:
        server.stop()


def report(results: list[Measured], args: argparse.Namespace) -> str:
    rows = []
    for m in results:
        rows.append([
            f"{m.heartbeat_s:g}", f"{m.agents:,}", SITES,
            agent_procs_for(m.agents, args.agent_procs),
            min(m.replica_pct), statistics.median(m.replica_pct),
            statistics.median(m.replica_msgs_s), statistics.median(m.server_pct),
            statistics.median(m.agents_pct), round(m.start_s),
            " ".join(f"{x:.2f}" for x in m.load),
        ])  # fmt: skip
    head = ["heartbeat s", "agents (emulated)", "sites", "agent procs", "replica % min",
            "replica % median", "msgs/s to replica", "nats-server %", "agent procs %",
            "join s", "load 1/5/15 at start"]  # fmt: skip
    return table(rows, head)


async def main_async(args: argparse.Namespace) -> int:
    default_hb = AgentConfig().heartbeat_interval_s
    runs = [(n, default_hb) for n in args.agents]
    if args.old_heartbeat != default_hb:
        runs += [(n, args.old_heartbeat) for n in args.old_agents]
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="mars-idle-cpu-") as tmp:
        for agents, hb in runs:
            results.append(await measure(agents, hb, args, Path(tmp)))
    cpu = cpu_model()
    print(
        f"idle CPU of one orchestrator replica; agents are emulated (mars sim agents, "
        f"emulated devices, one shared connection per agent process) over {SITES} sites; "
        f"nothing submitted"
    )
    print(
        f"machine: {os.cpu_count()} cores ({cpu}), load average before "
        f"{' '.join(f'{x:.2f}' for x in args.load_before)}; nats-server ping_interval "
        f"{PING_INTERVAL}, ping_max {PING_MAX}; default heartbeat {default_hb:g} s, old "
        f"{args.old_heartbeat:g} s; {args.windows} windows of {args.window:g} s each "
        "(% of one core)"
    )
    print(report(results, args))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.idle_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--agents", type=counts, default=[1000, 10000], help="fleet sizes")
    ap.add_argument("--window", type=float, default=15.0, help="seconds per CPU window")
    ap.add_argument("--windows", type=int, default=3, help="CPU windows per measurement")
    ap.add_argument(
        "--old-heartbeat", type=float, default=0.5, help="the baseline's heartbeat interval (s)"
    )
    ap.add_argument(
        "--old-agents", type=counts, default=[1000], help="fleet sizes measured at the old setting"
    )
    ap.add_argument("--agent-procs", type=int, default=SITES, help="processes the agents run in")
    args = ap.parse_args(argv)
    if args.window <= 0 or args.windows < 1 or args.agent_procs < 1:
        ap.error("--window must be > 0, --windows and --agent-procs >= 1")
    if not 0 < args.old_heartbeat <= 60:
        ap.error("--old-heartbeat must be in (0, 60]")
    args.load_before = os.getloadavg()
    with terminate_as_interrupt():
        return eventloop.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
