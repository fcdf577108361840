"""The secure multi-site topology `mars deploy` generates, against one embedded server, same run.

    python -m benchmarks.topology [--trials 20] [--placements 150] [--transfers 3]
        [--output-mib 8] [--quick]

Two setups run side by side in this process, every service a process of its own as deployed:

- **topology**: what `mars deploy` generates, on loopback (tests/topology.py): a hub cluster of
  3 nats-servers (JetStream R3), a leaf server per site (`a`, `b`), TLS on every connection and
  an nkey per identity, a `mars orchestrator` replica per hub node; site `a`'s leaf reaches each
  hub node through a link emulator (sim/linkemu, no shaping: it only counts bytes);
- **single**: one embedded nats-server (open, loopback only, as `mars demo` and the tests run
  it) and one `mars orchestrator`.

Each setup has the same `mars agent` processes, with emulated devices (one declared 1-slot
CPU each, never measured): `a1` (20 GFLOPS) and `a2` (10) at site a, `b1` at site b, `c1`,
`c2` in the cloud tier; heartbeats at the agent's default interval.

1. **Crash at a leaf site.** A pipeline whose first task may run on either agent of site a (it
   asks for the label zone=a) is placed on `a1`, the faster; once it runs there (its `started`
   event), `a1` is SIGKILLed at a random phase of its heartbeats. Measured on this host's
   monotonic clock: detection (kill -> the first replica's `agent_dead` cluster event, with its
   cause: `disconnect` is the server's DISCONNECT advisory, `heartbeat` missed heartbeats) and
   re-placement (kill -> the task's `started` event from another agent, dated back by the time
   it says it has run, as benchmarks/recovery.py does). `a1` is restarted after each trial.
   The two setups' trials alternate. Goal: crash -> re-placed <= 300 ms P99 in the topology.
2. **Uplink bytes of a large transfer.** A pipeline whose task on `a1` makes `--output-mib` of
   synthetic output consumed by a task on `a2` (same site), then one consumed on `b1` (the
   other site): the bytes crossing site a's uplink proxies (both directions, every hub node)
   from submit to the pipeline's end, less those of an idle window of the same length just
   before (heartbeats, replicas' chatter). Goal: ~0 for the same-site consumer.
3. **Placement latency.** `--placements` submissions of a 3-task pipeline of 1 ms synthetic
   tasks on the cloud agents, each timed from the submit request to its reply (which carries
   the committed plan), alternating between the two setups one submission at a time.

Progress goes to stderr; the report to stdout, with the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from benchmarks.common import pct, progress, table
from edge_agent.config import AgentConfig
from orchestrator.infra import eventloop
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.infra.procs import terminate_as_interrupt
from orchestrator.reliability.health import DEFAULT_MISSES
from orchestrator.state.pipelines import ran_since
from schemas import PipelineSpec, TaskEvent, subjects
from schemas.codec import decode
from schemas.presence import PING_INTERVAL, PING_MAX
from schemas.recovery import ClusterEvent
from tests.harness import agent_process_config
from tests.topology import Topology
from transport.client import Client

SITES = {"a": ["a1", "a2"], "b": ["b1"]}
CLOUD = ["c1", "c2"]
VICTIM = "a1"
HEARTBEAT_S = AgentConfig().heartbeat_interval_s
GOAL_S = 0.300
MIB = 1 << 20


def agent_settings(name: str) -> dict[str, Any]:
    """Each agent's settings, the same in both setups (one emulated 1-slot CPU each)."""
    zone = next((s for s, agents in SITES.items() if name in agents), "cloud")
    return {
        "gflops": 20.0 if name == VICTIM else 10.0,
        "labels": {"zone": zone},
        "heartbeat_interval_s": HEARTBEAT_S,
    }


def crash_pipeline(name: str) -> PipelineSpec:
    """`w` at site a (0.5 s on a1, 1 s on a2), then a short sink in the cloud."""
    run = {"kind": "synthetic", "seconds": 0.5, "ref_gflops": 20.0, "output_bytes": 1000}
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [
            {"id": "w", "run": run, "requires": {"labels": {"zone": "a"}}},
            {"id": "sink", "deps": ["w"], "run": {"kind": "synthetic", "seconds": 0.01},
             "requires": {"labels": {"zone": "cloud"}}},
        ]}
    )  # fmt: skip


def transfer_pipeline(name: str, consumer: str, size: int) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [
            {"id": "make", "run": {"kind": "synthetic", "seconds": 0.01, "output_bytes": size},
             "requires": {"pinned_agent": VICTIM}},
            {"id": "use", "deps": ["make"],
             "run": {"kind": "synthetic", "seconds": 0.01, "output_bytes": 100},
             "requires": {"pinned_agent": consumer}},
        ]}
    )  # fmt: skip


def small_pipeline(name: str) -> PipelineSpec:
    run = {"kind": "synthetic", "seconds": 0.001, "output_bytes": 100}
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [
            {"id": f"t{i}", "run": run, "requires": {"tiers": ["cloud"]}} for i in range(3)
        ]}
    )  # fmt: skip


@dataclass
class Watch:
    """Cluster deaths (agent, arrival, cause) and task `started` events, dated back to when
    they say the task began; all on this host's monotonic clock."""

    dead: list[tuple[str, float, str]] = field(default_factory=list)
    started: dict[tuple[str, str, str], float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_cluster(self, msg: Msg) -> None:
        ev = decode(msg.data, ClusterEvent)
        if ev.kind == "agent_dead":
            now = time.monotonic()
            self.dead += [(a, now, ev.cause) for a in ev.agents]
            self.changed.set()

    async def on_task(self, msg: Msg) -> None:
        ev = decode(msg.data, TaskEvent)
        if ev.state in ("started", "succeeded"):
            began = ran_since(time.monotonic(), ev)
            self.started.setdefault((ev.pipeline_id, ev.task_id, ev.agent_id), began)
            self.changed.set()

    async def until(self, cond: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not cond():
                self.changed.clear()
                await self.changed.wait()

    def first_death(self, agent: str, since: float) -> tuple[float, str] | None:
        hits = [(t, c) for a, t, c in self.dead if a == agent and t >= since]
        return min(hits) if hits else None


class Setup:
    """One deployment under test: its agents (processes), a watcher and an API client."""

    label = ""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.watch = Watch()
        self.watch_nc: NATS | None = None
        self.client: Client | None = None
        self.agents: dict[str, asyncio.subprocess.Process] = {}

    async def start(self) -> None:
        raise NotImplementedError

    async def start_agent(self, name: str) -> asyncio.subprocess.Process:
        raise NotImplementedError

    async def watch_connection(self) -> NATS:
        raise NotImplementedError

    async def client_connection(self) -> NATS:
        raise NotImplementedError

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self.watch_nc is not None:
            with contextlib.suppress(Exception):
                await self.watch_nc.close()

    async def ready(self) -> None:
        """Agents started; the watcher subscribed; every agent alive in the API's view."""
        for name in [*(a for agents in SITES.values() for a in agents), *CLOUD]:
            self.agents[name] = await self.start_agent(name)
        self.watch_nc = await self.watch_connection()
        await self.watch_nc.subscribe(subjects.CLUSTER_EVENTS, cb=self.watch.on_cluster)
        await self.watch_nc.subscribe(subjects.ALL_TASK_EVENTS, cb=self.watch.on_task)
        await self.watch_nc.flush()
        self.client = Client(await self.client_connection(), timeout=20.0)
        n = len(self.agents)
        alive = await self.client.wait_for_agents(n, 90)
        if alive < n:
            raise RuntimeError(f"{self.label}: only {alive} of {n} agents joined")

    async def wait_alive(self, name: str, timeout: float = 30.0) -> None:
        assert self.client is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                rep = await self.client.agents(alive_only=True)
                if name in {a.agent_id for a in rep.agents}:
                    return
            await asyncio.sleep(0.1)  # polling the API with a deadline
        raise RuntimeError(f"{self.label}: {name} not alive after {timeout:.0f} s")


class TopologySetup(Setup):
    label = "topology"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.topo = Topology(tmp, SITES, CLOUD, proxied=("a",))
        self.replica_restarts = 0

    async def start(self) -> None:
        await self.topo.start_servers()
        for h in self.topo.hub_names:
            await self.topo.start_replica(h)
        await self.ready()
        await self.replicas_up()

    async def replicas_up(self) -> None:
        """Every replica still running; one that exited (at start, e.g. a JetStream request
        that timed out while the cluster settled) is started again, and counted."""
        for _ in range(3):
            gone = [h for h in self.topo.hub_names
                    if self.topo.procs[f"orch-{h}"].returncode is not None]  # fmt: skip
            if not gone:
                return
            for h in gone:
                progress(f"topology: replica {h} exited at start; starting it again")
                self.replica_restarts += 1
                await self.topo.start_replica(h)
            await asyncio.sleep(3.0)  # long enough for its start to fail again, if it does
        raise RuntimeError("topology: replicas keep exiting at start")

    async def start_agent(self, name: str) -> asyncio.subprocess.Process:
        return await self.topo.start_agent(name, **agent_settings(name))

    async def watch_connection(self) -> NATS:
        # a replica's identity: the only one that may hear every task and cluster event
        return await self.topo.connect("replica", "h1")

    async def client_connection(self) -> NATS:
        return await self.topo.connect("user", "ops")  # an admin: the unsuffixed API

    def pings(self) -> str:
        """The ping settings of the generated hub and leaf configurations (JSON files)."""
        seen = set()
        for conf in (self.topo.out / "hub" / "h1" / "nats.conf",
                     self.topo.out / "sites" / "a" / "nats.conf"):  # fmt: skip
            text = conf.read_text()
            doc = json.loads(text[text.index("{") :])  # after its comment line
            seen.add(f"ping_interval {doc.get('ping_interval', 'default')} "
                     f"ping_max {doc.get('ping_max', 'default')}")  # fmt: skip
        return "; ".join(sorted(seen))

    def uplink_bytes(self) -> int:
        return sum(
            s["up_out"] + s["down_out"] for px in self.topo.uplinks["a"] for s in [px.stats()]
        )

    async def close(self) -> None:
        await super().close()
        await self.topo.close()


class SingleSetup(Setup):
    label = "single"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.server = EmbeddedNats(store_dir=str(tmp / "nats"))
        self.orch: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.server.start()
        self.orch = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "orchestrator", "--nats", self.server.url,
            env=self._env(),
        )  # fmt: skip
        await self.ready()

    @staticmethod
    def _env() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith("MARS_")}

    async def start_agent(self, name: str) -> asyncio.subprocess.Process:
        zone = agent_settings(name)["labels"]["zone"]
        cfg = agent_process_config(
            self.tmp, name, tier="cloud" if zone == "cloud" else "edge", site=zone,
            **agent_settings(name),
        )  # fmt: skip
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", "agent", "--nats", self.server.url,
            "--config", str(cfg), "--id", name, "--grace", "0", env=self._env(),
        )  # fmt: skip

    async def watch_connection(self) -> NATS:
        return await nats.connect(self.server.url)

    async def client_connection(self) -> NATS:
        return await nats.connect(self.server.url)

    async def close(self) -> None:
        await super().close()
        for p in [*self.agents.values(), *([self.orch] if self.orch else [])]:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        self.server.stop()


@dataclass
class Crash:
    setup: str
    detect_s: float = float("nan")
    cause: str = ""
    replaced_s: float = float("nan")
    ok: bool = False
    note: str = ""


async def crash_trial(s: Setup, i: int, rng: random.Random) -> Crash | None:
    """One crash of the victim while it runs `w`; None when `w` was not placed on it."""
    assert s.client is not None
    out = Crash(s.label)
    w = s.watch
    pid = f"crash-{s.label}-{i:03d}-{rng.randrange(1 << 30):x}"
    await asyncio.sleep(rng.uniform(0.0, HEARTBEAT_S))  # any phase of the victim's beats
    await s.client.submit(crash_pipeline(pid), pipeline_id=pid)
    await w.until(lambda: any(k[:2] == (pid, "w") for k in w.started), 20.0)
    where = next(k[2] for k in w.started if k[:2] == (pid, "w"))
    if where != VICTIM:
        await s.client.wait(pid, 30.0)
        return None
    proc = s.agents[VICTIM]
    os.kill(proc.pid, signal.SIGKILL)
    failed = time.monotonic()

    def again() -> float | None:
        times = [at for (p, t, a), at in w.started.items()
                 if p == pid and t == "w" and a != VICTIM and at >= failed]  # fmt: skip
        return min(times) if times else None

    try:
        await w.until(lambda: w.first_death(VICTIM, failed) is not None, 30.0)
        died = w.first_death(VICTIM, failed)
        assert died is not None
        out.detect_s, out.cause = died[0] - failed, died[1]
        await w.until(lambda: again() is not None, 30.0)
        out.replaced_s = (again() or 0.0) - failed
    finally:
        await proc.wait()
        s.agents[VICTIM] = await s.start_agent(VICTIM)
    st = await s.client.wait(pid, 60.0)
    out.ok = st.state == "succeeded"
    out.note = st.reason
    await s.wait_alive(VICTIM)
    return out


async def crash_phase(setups: list[Setup], trials: int, rng: random.Random) -> list[Crash]:
    done: list[Crash] = []
    skipped = 0
    for i in range(trials):
        for s in setups:
            for _ in range(5):
                c = await crash_trial(s, i, rng)
                if c is not None:
                    break
                skipped += 1
            if c is None:
                raise RuntimeError(f"{s.label}: w never placed on {VICTIM}")
            done.append(c)
            progress(
                f"crash {s.label} {i + 1}/{trials}: detect {c.detect_s * 1e3:.0f} ms "
                f"({c.cause}), re-placed {c.replaced_s * 1e3:.0f} ms, "
                f"{'ok' if c.ok else 'FAILED ' + c.note[:200]}"
            )
    if skipped:
        progress(f"crash: {skipped} pipelines placed w elsewhere than {VICTIM}, tried again")
    return done


@dataclass
class Transfer:
    consumer: str
    size: int
    window_s: float
    during: int
    idle: int
    ok: bool
    note: str = ""

    @property
    def net(self) -> int:
        return self.during - self.idle


async def transfer_run(
    t: TopologySetup, consumer: str, size: int, i: int, window: float, timeout: float
) -> Transfer:
    assert t.client is not None
    b0 = t.uplink_bytes()
    await asyncio.sleep(window)
    idle = t.uplink_bytes() - b0
    pid = f"xfer-{consumer}-{i:03d}-{random.randrange(1 << 30):x}"
    b0, t0 = t.uplink_bytes(), time.monotonic()
    await t.client.submit(transfer_pipeline(pid, consumer, size), pipeline_id=pid)
    ok, note = False, ""
    try:
        st = await t.client.wait(pid, timeout)
        ok, note = st.state == "succeeded", st.reason
    except TimeoutError:
        note = f"not finished after {timeout:.0f} s"
    dt = time.monotonic() - t0
    during = t.uplink_bytes() - b0
    if not ok:
        with contextlib.suppress(Exception):
            await t.client.cancel(pid, "benchmark: transfer did not finish")
    # the idle window was `window` long; scaled to this run's length (the same when they match)
    return Transfer(consumer, size, dt, during, round(idle * dt / window), ok, note)


async def transfer_phase(t: TopologySetup, runs: int, size: int, timeout: float) -> list[Transfer]:
    out: list[Transfer] = []
    for consumer in ("a2", "b1"):
        warm = await transfer_run(t, consumer, size, 0, 1.0, timeout)  # sets the window
        if not warm.ok:  # counted, and not tried again: each failure costs `timeout`
            progress(f"transfer a1 -> {consumer}: FAILED ({warm.note[:200]})")
            out.append(warm)
            continue
        window = warm.window_s
        for i in range(runs):
            r = await transfer_run(t, consumer, size, i + 1, window, timeout)
            window = r.window_s
            out.append(r)
            progress(
                f"transfer a1 -> {consumer} {i + 1}/{runs}: {r.window_s:.2f} s, uplink "
                f"{r.during / MIB:.2f} MiB during, {r.idle / MIB:.3f} MiB idle"
                + ("" if r.ok else f", FAILED ({r.note[:200]})")
            )
    return out


async def placement_phase(setups: list[Setup], n: int, warmup: int) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {s.label: [] for s in setups}
    for i in range(warmup + n):
        for s in setups:
            assert s.client is not None
            t0 = time.perf_counter()
            await s.client.submit(small_pipeline(f"place-{i}"))
            dt = time.perf_counter() - t0
            if i >= warmup:
                lat[s.label].append(dt)
        if (i + 1) % 50 == 0:
            progress(f"placement: {i + 1}/{warmup + n} submissions per setup")
    return lat


def ms(x: float) -> float:
    return x * 1e3


def report_crash(crashes: list[Crash]) -> str:
    rows = []
    for label in ("topology", "single"):
        cs = [c for c in crashes if c.setup == label]
        det = [c.detect_s for c in cs if c.detect_s == c.detect_s]
        rep = [c.replaced_s for c in cs if c.replaced_s == c.replaced_s]
        causes = sorted({c.cause for c in cs})
        by = ", ".join(f"{k} {sum(c.cause == k for c in cs)}" for k in causes)
        p99 = pct(rep, 99)
        rows.append([
            label, len(cs), sum(c.ok for c in cs), by,
            ms(pct(det, 50)), ms(pct(det, 99)), ms(pct(rep, 50)), ms(p99), ms(max(rep or [0.0])),
            "met" if p99 <= GOAL_S else "MISSED",
        ])  # fmt: skip
    head = ["setup", "trials", "ok", "detected by", "detect P50 ms", "detect P99 ms",
            "re-placed P50 ms", "re-placed P99 ms", "max ms", "goal <= 300 ms P99"]  # fmt: skip
    return table(rows, head)


def report_transfer(ts: list[Transfer]) -> str:
    rows = []
    for consumer, where in (("a2", "same site"), ("b1", "other site")):
        rs = [r for r in ts if r.consumer == consumer]
        if not rs:
            continue
        nets = sorted(r.net for r in rs)
        mid = nets[len(nets) // 2]
        size = rs[0].size
        ratio = mid / size
        path = ("site-local (never crossed the uplink)" if ratio < 0.1
                else f"crossed the uplink ~{ratio:.1f}x (via the hub)")  # fmt: skip
        if not any(r.ok for r in rs):
            path += "; DID NOT FINISH: " + rs[0].note[:80]
        rows.append([
            f"a1 -> {consumer} ({where})", len(rs), sum(r.ok for r in rs), size / MIB,
            sorted(r.window_s for r in rs)[len(rs) // 2],
            sorted(r.during for r in rs)[len(rs) // 2] / MIB,
            sorted(r.idle for r in rs)[len(rs) // 2] / MIB,
            mid / MIB, min(nets) / MIB, max(nets) / MIB, path,
        ])  # fmt: skip
    head = ["transfer", "runs", "ok", "output MiB", "pipeline s", "uplink MiB during",
            "idle MiB", "net MiB (median)", "min", "max", "path (by the byte count)"]  # fmt: skip
    return table(rows, head)


def report_placement(lat: dict[str, list[float]]) -> str:
    rows = [[k, len(v), ms(pct(v, 50)), ms(pct(v, 90)), ms(pct(v, 99)), ms(max(v or [0.0]))]
            for k, v in lat.items()]  # fmt: skip
    return table(rows, ["setup", "submissions", "P50 ms", "P90 ms", "P99 ms", "max ms"])


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


async def main_async(args: argparse.Namespace) -> int:
    before = load()
    tmp = Path(tempfile.mkdtemp(prefix="mars-topology-bench-"))
    (tmp / "topology").mkdir()
    (tmp / "single").mkdir()
    topo = TopologySetup(tmp / "topology")
    single = SingleSetup(tmp / "single")
    setups: list[Setup] = [topo, single]
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    try:
        progress("starting the generated topology (3 hub nodes, 2 leaf sites, TLS, nkeys)")
        await topo.start()
        pings = topo.pings()
        progress("starting the single embedded server")
        await single.start()
        lat = await placement_phase(setups, args.placements, args.warmup)
        crashes = await crash_phase(setups, args.trials, rng)
        transfers = await transfer_phase(
            topo, args.transfers, args.output_mib * MIB, args.transfer_timeout
        )
    finally:
        await topo.close()
        await single.close()
        shutil.rmtree(tmp, ignore_errors=True)
    took = time.monotonic() - t_start
    print(
        f"topology benchmark: load average before {before}, after {load()} "
        f"({os.cpu_count()} cores); {took:.0f} s"
    )
    print(
        f"settings: agent heartbeat {HEARTBEAT_S:g} s x {DEFAULT_MISSES} misses; server pings: "
        f"generated topology {pings}, "
        f"embedded server ping_interval {PING_INTERVAL} ping_max {PING_MAX}; "
        f"--trials {args.trials} --placements {args.placements} --transfers {args.transfers} "
        f"--output-mib {args.output_mib} --seed {args.seed}; topology replicas restarted "
        f"after exiting at start: {topo.replica_restarts}"
    )
    print(
        "setups, side by side in one run: topology = `mars deploy` output on loopback (3 hub "
        "nats-servers R3, leaf servers for sites a and b, TLS, nkeys, a replica per hub node; "
        "site a's uplinks through unshaped link emulators that count bytes); single = one "
        "embedded open nats-server and one replica. Agents: a1, a2 (site a), b1 (site b), "
        "c1, c2 (cloud), each one EMULATED 1-slot CPU (declared, not measured)."
    )
    print()
    print(f"1. crash of {VICTIM} (SIGKILL) while it runs a task -> task started on another agent")
    print("   (trials alternate between the setups)")
    print(report_crash(crashes))
    print()
    print("2. uplink bytes of site a (all hub links, both directions) during a large transfer,")
    print("   less an idle window of the same length just before")
    print(report_transfer(transfers))
    print()
    print("3. placement: submit -> reply (committed plan), 3-task pipelines on the cloud agents,")
    print(f"   one submission per setup in turn ({args.warmup} per setup not counted)")
    print(report_placement(lat))
    bad = [c for c in crashes if not c.ok] + [t for t in transfers if not t.ok]
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.topology", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--trials", type=int, default=20, help="crash trials per setup")
    ap.add_argument("--placements", type=int, default=150, help="timed submissions per setup")
    ap.add_argument("--warmup", type=int, default=10, help="submissions per setup not counted")
    ap.add_argument("--transfers", type=int, default=3, help="transfer runs per consumer")
    ap.add_argument("--output-mib", type=int, default=8, help="the large output's size")
    ap.add_argument("--transfer-timeout", type=float, default=30.0,
                    help="seconds a transfer pipeline may take before it is cancelled")  # fmt: skip
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true",
                    help="5 crash trials, 40 placements, 1 transfer run per consumer")  # fmt: skip
    args = ap.parse_args(argv)
    if args.quick:
        args.trials, args.placements, args.transfers, args.warmup = 5, 40, 1, 5
    args.trials = max(1, args.trials)
    args.placements = max(1, args.placements)
    args.transfers = max(1, args.transfers)
    logging.basicConfig(level=logging.ERROR)
    with terminate_as_interrupt():  # SIGTERM too stops every process and removes their files
        return eventloop.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
