"""`mars sim up` / `mars sim down`: a fleet of real processes behind emulated links.

Why processes and a state file: `sim up` returns once the fleet is ready, so a shell, a test or
a benchmark can drive it with the ordinary CLI (`mars submit`, `mars agents`) and stop it with
`mars sim down`, which finds everything through the state file in the run directory.

What `up` starts, each in its own session so it outlives `sim up` (and no terminal signal
reaches it by accident):
- a JetStream nats-server on a free loopback port, its store under RUNDIR/nats;
- one link-emulator supervisor (`python -m sim.linkemu serve`) with one proxy per agent, whose
  profile is the agent's access path in the topology (see `sim.topology`);
- the orchestrator, connected straight to the server (it lives at the hub);
- one `mars agent` process per agent, connected through its own proxy, with a generated config
  (RUNDIR/agents/ID.yaml: emulated devices, declared links equal to the emulated paths).
Logs go to RUNDIR/logs. Each process is recorded with its pid *and* start time, so `down` never
signals a recycled pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from orchestrator.infra import eventloop
from orchestrator.infra.natsserver import find_binary, free_port, server_env
from orchestrator.infra.procs import stop_all
from schemas.linkcontrol import LinkControl
from sim.linkemu import LinkSpecEntry, control_request, profile_to_dict, write_spec
from sim.topology import Topology, load_topology

STATE_FILE = "state.json"
DEFAULT_DIR = os.environ.get("MARS_SIM_DIR", ".mars-sim")


class SimError(RuntimeError):
    pass


@dataclass
class ProcRecord:
    role: str  # nats | linkemu | orchestrator | agent
    name: str
    pid: int
    create_time: float
    log: str
    #: The argv it was started with (names files under the run dir: unique to this fleet).
    cmdline: list[str] = field(default_factory=list)


@dataclass
class SimState:
    topology: str
    name: str
    run_dir: str
    nats_url: str
    control_port: int = 0
    processes: list[ProcRecord] = field(default_factory=list)
    #: agent id -> {"site", "port", "url", "profile"}
    links: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, role: str, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        """Note a process just started as this fleet's (known for ours by its argv, else
        its start time: `_ours`), and save the state; raises SimError if it is gone."""
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error as exc:
            raise SimError(f"{role} {name} exited at start; see {log}") from exc
        argv = [str(a) for a in proc.args] if isinstance(proc.args, list) else [str(proc.args)]
        self.processes.append(ProcRecord(role, name, proc.pid, created, str(log), argv))
        self.save()

    def save(self) -> None:
        path = Path(self.run_dir) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> SimState:
        raw = json.loads((run_dir / STATE_FILE).read_text())
        procs = [ProcRecord(**p) for p in raw.pop("processes", [])]
        return cls(**raw, processes=procs)


# -- processes -----------------------------------------------------------------------------------
def _detached(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _ours(rec: ProcRecord) -> psutil.Process | None:
    """The live process of a record, or None (gone, a zombie, or the pid now names another).

    Known by the argv it was started with. Its start time alone is not enough: psutil
    derives it from the boot time, which moves when the wall clock is stepped (seen here:
    4.4 s between a start and its `down`, which then took a live fleet for gone and left it
    running). It is the fallback where there is no argv to go by: a state file from before
    argv was recorded, or a process that has not got its own yet. `Popen` returns once the
    child's exec is under way, and for a moment after that its arguments read empty (seen
    in ~5-25% of looks made at once): taken for gone, a nats-server just started was said to
    have "exited at start", and the clean-up that followed at once left it running."""
    try:
        p = psutil.Process(rec.pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        if rec.cmdline and (argv := p.cmdline()):
            return p if argv == rec.cmdline else None
        return p if abs(p.create_time() - rec.create_time) <= 0.5 else None
    except psutil.Error:
        return None


def _tail(path: str, n: int = 1500) -> str:
    try:
        return Path(path).read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _wait_until(pred: Any, timeout: float, what: str, rec: ProcRecord | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if rec is not None and _ours(rec) is None:
            raise SimError(f"{rec.role} {rec.name} exited at start:\n{_tail(rec.log)}")
        time.sleep(0.05)  # polling a child we do not own the pipes of
    raise SimError(f"{what} not ready after {timeout:.0f} s")


def _port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
        return True
    return False


def _mars(*args: str) -> list[str]:
    return [sys.executable, "-m", "console.cli", *args]


# -- up --------------------------------------------------------------------------------------------
def up(
    topology_path: str | Path,
    run_dir: str | Path = DEFAULT_DIR,
    *,
    timeout: float = 60.0,
    verbose: int = 0,
) -> SimState:
    """Start the fleet of a topology; return once every agent is alive (or raise, having
    stopped whatever it started)."""
    topo = load_topology(topology_path)
    rd = Path(run_dir).resolve()
    rd.mkdir(parents=True, exist_ok=True)
    if (rd / STATE_FILE).exists():
        old = SimState.load(rd)
        if any(_ours(p) is not None for p in old.processes):
            raise SimError(f"a fleet is already up in {rd}; run `mars sim down --dir {rd}`")
        (rd / STATE_FILE).unlink()
    for sub in ("nats", "agents", "logs"):
        shutil.rmtree(rd / sub, ignore_errors=True)  # a fresh JetStream store, fresh logs
        (rd / sub).mkdir()
    port = free_port()
    state = SimState(
        topology=str(Path(topology_path).resolve()),
        name=topo.name,
        run_dir=str(rd),
        nats_url=f"nats://127.0.0.1:{port}",
    )
    state.save()
    started: list[subprocess.Popen[bytes]] = []
    try:
        _start(topo, state, rd, port, timeout, verbose, started)
    except BaseException:
        # what it started goes, whatever failed: by its records (agents and orchestrator
        # first), then any child still running that they missed (not recorded, or not known
        # for ours); the failure said is the first one
        with contextlib.suppress(Exception):
            down(rd)
        stop_all(started)
        raise
    return state


def _start(
    topo: Topology,
    state: SimState,
    rd: Path,
    port: int,
    timeout: float,
    verbose: int,
    started: list[subprocess.Popen[bytes]],
) -> None:
    """Start the fleet, each process put in `started` as soon as it is."""
    logs = rd / "logs"
    nats_log = logs / "nats-server.log"
    proc = subprocess.Popen(
        [find_binary(), "-a", "127.0.0.1", "-p", str(port), "-js",
         "-sd", str(rd / "nats" / "jetstream"), "-l", str(nats_log)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=server_env(),
    )  # fmt: skip
    started.append(proc)
    state.record("nats", "nats-server", proc, nats_log)
    _wait_until(
        lambda: "Server is ready" in _tail(str(nats_log), 1 << 20) and _port_open(port),
        15.0,
        "nats-server",
        state.processes[-1],
    )

    agents = topo.expanded_agents()
    entries = [
        LinkSpecEntry(aid, "127.0.0.1", port, topo.access(a.site), seed=topo.seed + i)
        for i, (aid, a) in enumerate(agents)
    ]
    ready = rd / "linkemu.ready.json"
    ready.unlink(missing_ok=True)
    write_spec(rd / "linkemu.json", entries, ready)
    emu_log = logs / "linkemu.log"
    proc = _detached(
        [sys.executable, "-m", "sim.linkemu", "serve", "--spec", str(rd / "linkemu.json")], emu_log
    )
    started.append(proc)
    state.record("linkemu", "linkemu", proc, emu_log)
    _wait_until(ready.exists, 15.0, "link emulator", state.processes[-1])
    info = json.loads(ready.read_text())
    state.control_port = int(info["control_port"])
    for e in entries:
        lp = int(info["links"][e.name])
        site = dict(agents)[e.name].site
        state.links[e.name] = {
            "site": site,
            "port": lp,
            "url": f"nats://127.0.0.1:{lp}",
            "profile": profile_to_dict(e.profile),
        }
    state.save()

    vflags = ["-v"] * verbose
    orch_log = logs / "orchestrator.log"
    proc = _detached(_mars(*vflags, "orchestrator", "--nats", state.nats_url), orch_log)
    started.append(proc)
    state.record("orchestrator", "orchestrator", proc, orch_log)

    for aid, agent in agents:
        cfg = rd / "agents" / f"{aid}.yaml"
        cfg.write_text(yaml.safe_dump(topo.agent_config(agent), sort_keys=False))
        alog = logs / f"agent-{aid}.log"
        args = ["agent", "--nats", state.links[aid]["url"], "--config", str(cfg), "--id", aid]
        proc = _detached(_mars(*vflags, *args), alog)
        started.append(proc)
        state.record("agent", aid, proc, alog)

    n = len(agents)
    alive = eventloop.run(_wait_for_agents(state, n, timeout))
    if alive < n:
        dead = [p for p in state.processes if _ours(p) is None]
        detail = "".join(f"\n--- {p.role} {p.name}:\n{_tail(p.log)}" for p in dead[:3])
        raise SimError(f"only {alive}/{n} agents came up within {timeout:.0f} s{detail}")


async def _wait_for_agents(state: SimState, n: int, timeout: float) -> int:
    from transport.client import Client

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    client = await Client.connect(state.nats_url)
    try:
        while True:
            left = deadline - loop.time()
            alive = await client.wait_for_agents(n, timeout=max(0.0, min(left, 1.0)))
            if alive >= n or loop.time() >= deadline:
                return alive
            crashed = [p for p in state.processes if _ours(p) is None]
            if crashed:
                return alive
    finally:
        await client.close()


# -- down ------------------------------------------------------------------------------------------
def down(run_dir: str | Path = DEFAULT_DIR, grace: float = 10.0) -> list[str]:
    """Stop what `up` started (agents and orchestrator first, so their last words still reach
    the server; then the emulator and the server): SIGTERM, SIGKILL after `grace`. Returns
    what was stopped; removes the state file."""
    rd = Path(run_dir).resolve()
    if not (rd / STATE_FILE).exists():
        raise SimError(f"no fleet state in {rd}")
    state = SimState.load(rd)
    stopped: list[str] = []
    waves = [("agent", "orchestrator"), ("linkemu",), ("nats",)]
    for roles in waves:
        live = [(r, p) for r in state.processes if r.role in roles if (p := _ours(r)) is not None]
        for _, p in live:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        left = _wait_gone([r for r, _ in live], grace)
        for r in left:
            if (p := _ours(r)) is not None:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        _wait_gone(left, grace)
        stopped.extend(f"{r.role} {r.name} (pid {r.pid})" for r, _ in live)
    (rd / STATE_FILE).unlink(missing_ok=True)
    return stopped


def _wait_gone(recs: list[ProcRecord], timeout: float) -> list[ProcRecord]:
    """Poll until none of `recs` is alive; return those still alive at the deadline. Polling,
    because they are not our children once `up` has returned (an orphan that nobody reaps stays
    a zombie, which counts as gone)."""
    deadline = time.monotonic() + timeout
    left = recs
    while left:
        left = [r for r in left if _ours(r) is not None]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return left


def alive(pid: int) -> bool:
    """A process with this pid runs (a zombie does not count)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def pids(run_dir: str | Path = DEFAULT_DIR) -> list[int]:
    """Pids of the processes of a fleet that are still alive (for checks and tests)."""
    rd = Path(run_dir).resolve()
    if not (rd / STATE_FILE).exists():
        return []
    return [r.pid for r in SimState.load(rd).processes if _ours(r) is not None]


def link_control(run_dir: str | Path, op: str, agent: str | None = None, **kw: Any) -> Any:
    """Cut, restore, re-profile or show the emulated link of one agent (or of all)."""
    state = SimState.load(Path(run_dir).resolve())
    if agent is not None and agent not in state.links:
        raise SimError(f"no agent {agent!r} in this fleet (known: {sorted(state.links)})")
    req = LinkControl.model_validate({"op": op, "link": agent, **kw})
    rep = eventloop.run(control_request(state.control_port, req))
    if not rep.ok:
        raise SimError(f"{rep.code}: {rep.error}")
    return {name: status.model_dump() for name, status in rep.links.items()}


def describe(state: SimState) -> str:
    lines = [
        f"sim fleet {state.name!r} up in {state.run_dir}",
        f"  nats-server  {state.nats_url}   (orchestrator connects directly)",
    ]
    for aid, link in state.links.items():
        p = link["profile"]
        bw = f"{p['bandwidth_mbps']:g} Mbit/s" if p["bandwidth_mbps"] else "unlimited"
        lines.append(
            f"  {aid:<16} site={link['site']:<10} via {link['url']}  "
            f"{p['latency_ms']:g} ms +-{p['jitter_ms']:g}, {bw}, loss {p['loss']:g}"
        )
    lines.append(f"  logs in {state.run_dir}/logs; stop with: mars sim down --dir {state.run_dir}")
    return "\n".join(lines)
