"""Failure detection and recovery over a real nats-server: kill -9, silent links, new
incarnations, agents that give work back; every result committed exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.aio.msg import Msg

from orchestrator.infra.procs import spawn
from orchestrator.reliability import recovery
from orchestrator.reliability.results import revisions
from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec, subjects
from schemas.codec import decode, encode
from schemas.events import TaskEvent
from schemas.recovery import ClusterEvent, TaskResult
from sim.linkemu import LinkProxy
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from transport.rpc import settle

pytestmark = pytest.mark.integration

#: Survivors are half as fast as the victim, so the planner puts the work on the victim.
SLOW = {"probe_cpu": False, "probe_gpus": False, "probe_accelerators": False}


def device(gflops: float, slots: int = 2) -> dict[str, Any]:
    return {"device_id": "cpu0", "kind": "cpu", "gflops": gflops, "slots": slots,
            "emulated": True, "memory_mb": 4096.0}  # fmt: skip


def survivors() -> dict[str, Any]:
    return {f"s{i}": agent_config("edge", "edge", **SLOW, devices=[device(100.0)]) for i in (1, 2)}


def victim_config(**kw: Any) -> dict[str, Any]:
    return {"site": "edge", "tier": "edge", **SLOW, "devices": [device(200.0, 4)],
            "link_probe_every_s": 0, "recalibrate_every_s": 0, "heartbeat_interval_s": 0.5,
            **kw}  # fmt: skip


def diamond(name: str, seconds: float = 1.0, out: int = 2000) -> PipelineSpec:
    """src -> a, b, c -> join; each `seconds` on a 100-GFLOP/s device, half on the victim."""

    def syn(s: float) -> dict[str, Any]:
        return {"kind": "synthetic", "seconds": s, "ref_gflops": 100.0, "output_bytes": out}

    tasks = [
        {"id": "src", "run": syn(seconds / 2)},
        *({"id": x, "run": syn(seconds), "deps": ["src"]} for x in ("a", "b", "c")),
        {"id": "join", "run": syn(seconds / 2), "deps": ["a", "b", "c"]},
    ]
    return PipelineSpec.model_validate({"name": name, "tasks": tasks})


class ClusterEvents:
    """Every cluster event with the local monotonic time it arrived."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, ClusterEvent]] = []
        self.changed = asyncio.Condition()
        self.nc: Any = None

    async def start(self, url: str) -> None:
        self.nc = await nats.connect(url)
        await self.nc.subscribe(subjects.CLUSTER_EVENTS, cb=self._on)
        await settle(self.nc)

    async def _on(self, msg: Msg) -> None:
        self.seen.append((time.monotonic(), decode(msg.data, ClusterEvent)))
        async with self.changed:
            self.changed.notify_all()

    def find(self, kind: str, agent: str) -> tuple[float, ClusterEvent] | None:
        return next(((t, e) for t, e in self.seen if e.kind == kind and agent in e.agents), None)

    async def wait(self, kind: str, agent: str, timeout: float) -> tuple[float, ClusterEvent]:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(lambda: self.find(kind, agent) is not None)
        got = self.find(kind, agent)
        assert got is not None
        return got

    async def stop(self) -> None:
        await self.nc.close()


def on_agent(run: PipelineRun, agent: str, state: str) -> bool:
    return any(tr.agent_id == agent and tr.state == state for tr in run.tasks.values())


async def results(url: str, run: PipelineRun) -> dict[str, list[TaskResult]]:
    """Every revision of every task's committed result (none: an empty list)."""
    nc = await nats.connect(url)
    try:
        got = await revisions(nc.jetstream(), run.pipeline_id)
        return {tid: got.get(tid, []) for tid in run.tasks}
    finally:
        await nc.close()


async def assert_exactly_once(url: str, run: PipelineRun) -> None:
    assert run.state == "succeeded", run.reason
    committed = await results(url, run)
    assert {t: len(v) for t, v in committed.items()} == {t: 1 for t in run.tasks}
    assert run.results_committed == len(run.tasks)
    st = run.status(0.0)
    assert st.results_committed == len(run.tasks)
    assert st.recoveries >= 1


def start_victim(url: str, tmp: Path, agent_id: str, **kw: Any) -> subprocess.Popen[bytes]:
    cfg = tmp / f"{agent_id}.yaml"
    # its journal under the test's directory: a SIGKILLed agent cannot remove its own
    cfg.write_text(yaml.safe_dump({"buffer_dir": str(tmp / "agent-state"), **victim_config(**kw)}))
    log = open(tmp / f"{agent_id}.log", "ab")  # noqa: SIM115  # the child holds it
    return spawn(["agent", "--nats", url, "--config", str(cfg), "--id", agent_id], log=log)


async def stop_with_victim(
    proc: subprocess.Popen[bytes], orch: Orchestrator, agents: list[RecordingAgent]
) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    await stop_cluster(orch, agents)


async def test_kill_9_mid_pipeline_recovers_and_commits_each_result_once(
    nats_url: str, tmp_path: Path
) -> None:
    orch, agents = await start_cluster(nats_url, survivors())
    events = ClusterEvents()
    await events.start(nats_url)
    proc = start_victim(nats_url, tmp_path, "victim")
    try:
        assert await orch.wait_for_agents(3, timeout=30.0) == 3
        reply = await orch.submit_spec(diamond("kill9"), pipeline_id="kill9")
        run = orch.pipelines[reply.pipeline_id]
        assert any(p.agent_id == "victim" for p in reply.plan), reply.plan
        # kill it while it runs a task, its first output already handed on
        await orch.wait_for(
            lambda: run.tasks["src"].state == "succeeded" and on_agent(run, "victim", "started"),
            timeout=20.0,
        )
        src_ran_on = run.tasks["src"].agent_id
        on_victim = {t for t, tr in run.tasks.items() if tr.agent_id == "victim"}
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        at, ev = await events.wait("agent_dead", "victim", timeout=10.0)
        assert ev.cause == "disconnect"  # the server's advisory, not the heartbeat timeout
        assert at - killed < 1.0
        await orch.wait_terminal(run.pipeline_id, timeout=30.0)
        await assert_exactly_once(nats_url, run)
        # whatever was unfinished on the victim ran on a survivor
        ran = {rec[1] for a in agents for rec in a.log if rec[0] == run.pipeline_id}
        unfinished = {t for t in on_victim if run.tasks[t].agent_id != "victim"}
        assert unfinished and unfinished <= ran
        assert all(run.tasks[t].agent_id in ("s1", "s2") for t in unfinished)
        assert any("agent victim dead (disconnect)" in line for line in run.placement_log)
        if src_ran_on == "victim":  # its output died with it: it ran again, committed once
            assert any("re-running src" in line for line in run.placement_log)
            assert "src" in ran and run.results_dropped >= 1
            first = (await results(nats_url, run))["src"][0]
            assert first.agent_id == "victim" and first.token != run.tasks["src"].token
        # its reservations are gone
        assert not [
            w
            for k, c in orch.store.snapshot().items()
            if k.startswith("dev.victim.")
            for w in c.book.windows
            if w.pipeline_id == run.pipeline_id
        ]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        await events.stop()
        await stop_cluster(orch, agents)


async def start_behind(url: str, proxy_target: str, agent_id: str) -> tuple[LinkProxy, Any]:
    host, port = proxy_target.rsplit("//", 1)[1].split(":")
    proxy = LinkProxy(host, int(port))
    await proxy.start()
    cfg = agent_config("edge", "edge", **SLOW, devices=[device(200.0, 4)])
    agent = RecordingAgent(proxy.url, cfg, agent_id=agent_id, calibrate=False)
    await agent.start()
    return proxy, agent


async def test_silent_link_is_detected_within_interval_times_misses_and_recovered(
    nats_url: str,
) -> None:
    orch, agents = await start_cluster(nats_url, survivors())
    events = ClusterEvents()
    await events.start(nats_url)
    proxy, victim = await start_behind(nats_url, nats_url, "victim")
    try:
        assert await orch.wait_for_agents(3, timeout=10.0) == 3
        run = await _submit(orch, "silent")
        await orch.wait_for(lambda: on_agent(run, "victim", "started"), timeout=20.0)
        on_victim = {
            t for t, tr in run.tasks.items() if tr.agent_id == "victim" and tr.state != "succeeded"
        }
        proxy.cut()  # TCP stays open; no byte crosses
        cut = time.monotonic()
        at, ev = await events.wait("agent_dead", "victim", timeout=10.0)
        assert ev.cause == "heartbeat"
        interval = victim.config.heartbeat_interval_s
        window = interval * orch.view.misses
        assert window - interval - 0.05 <= at - cut <= window + 0.5
        await orch.wait_for(lambda: run.recoveries >= 1, timeout=10.0)
        # the link heals mid-pipeline: what the victim did meanwhile arrives, and is stale
        proxy.restore()
        await orch.wait_for(lambda: run.stale_events >= 1, timeout=10.0)
        await orch.wait_terminal(run.pipeline_id, timeout=30.0)
        await assert_exactly_once(nats_url, run)
        assert all(run.tasks[t].agent_id in ("s1", "s2") for t in on_victim)
        await events.wait("agent_alive", "victim", timeout=10.0)
    finally:
        await victim.stop()
        await proxy.stop()
        await events.stop()
        await stop_cluster(orch, agents)


async def _submit(orch: Orchestrator, pid: str) -> PipelineRun:
    reply = await orch.submit_spec(diamond(pid), pipeline_id=pid)
    assert any(p.agent_id == "victim" for p in reply.plan), reply.plan
    return orch.pipelines[pid]


async def test_new_incarnation_is_a_new_agent_and_the_old_ones_work_is_stale(
    nats_url: str,
) -> None:
    orch, agents = await start_cluster(nats_url, survivors())
    events = ClusterEvents()
    await events.start(nats_url)
    proxy, zombie = await start_behind(nats_url, nats_url, "victim")
    reborn: RecordingAgent | None = None
    try:
        assert await orch.wait_for_agents(3, timeout=10.0) == 3
        run = await _submit(orch, "reborn")
        await orch.wait_for(lambda: on_agent(run, "victim", "started"), timeout=20.0)
        old = {t: tr.token for t, tr in run.tasks.items() if tr.agent_id == "victim"}
        proxy.cut()
        # the agent restarts (new incarnation, same id) long before its heartbeats are missed
        cfg = agent_config("edge", "edge", **SLOW, devices=[device(200.0, 4)])
        reborn = RecordingAgent(nats_url, cfg, agent_id="victim", calibrate=False)
        await reborn.start()
        _, ev = await events.wait("agent_dead", "victim", timeout=10.0)
        assert ev.cause == "new_incarnation"
        await orch.wait_for(lambda: run.recoveries >= 1, timeout=10.0)
        # the zombie comes back: its adverts do not take the id back, its events are stale
        proxy.restore()
        await orch.wait_for(lambda: run.stale_events >= 1, timeout=10.0)
        await orch.wait_terminal(run.pipeline_id, timeout=30.0)
        await assert_exactly_once(nats_url, run)
        # nothing placed on the old incarnation survived under its old token
        assert all(run.tasks[t].token != tok for t, tok in old.items() if tok)
        assert orch.view.agents["victim"].advert.incarnation == reborn.incarnation
        # the new incarnation only ever ran work placed on it
        for pid, tid, *_ in reborn.log:
            assert pid != run.pipeline_id or run.tasks[tid].agent_id == "victim"
    finally:
        if reborn is not None:
            await reborn.stop()
        await zombie.stop()
        await proxy.stop()
        await events.stop()
        await stop_cluster(orch, agents)


async def test_task_the_agent_cancels_itself_is_placed_again(nats_url: str) -> None:
    configs = {**survivors(), "victim": agent_config("edge", "edge", **SLOW,
                                                     devices=[device(200.0, 4)])}  # fmt: skip
    orch, agents = await start_cluster(nats_url, configs)
    victim = next(a for a in agents if a.agent_id == "victim")
    try:
        run = await _submit(orch, "drained")
        await orch.wait_for(lambda: on_agent(run, "victim", "started"), timeout=20.0)
        victim.drain(deadline_s=0.05)  # the deadline passes: the agent cancels its work
        await orch.wait_terminal(run.pipeline_id, timeout=30.0)
        await assert_exactly_once(nats_url, run)
        assert any("cancelled" in line and "itself" in line for line in run.placement_log)
    finally:
        await stop_cluster(orch, agents)


async def test_tasks_waiting_for_room_are_placed_as_soon_as_an_agent_joins(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only agent running a pipeline dies (kill -9; a fleet restarting, no other up):
    its tasks' re-placement finds no room and waits. An agent joining is room, so the wait
    is tried again at once, not at its next periodic retry (here a minute away). Before, a
    restarted fleet's tasks waited up to STUCK_RETRY_S (5 s), and when a server outage came
    in between, until the stall watchdog (booking_stress seed 515: a 12.7 s pipeline)."""
    monkeypatch.setattr(recovery, "STUCK_RETRY_S", 60.0)
    orch = Orchestrator(nats_url, name="orch")
    await orch.start()
    proc = start_victim(nats_url, tmp_path, "v1", devices=[device(200.0, 1)])
    late: RecordingAgent | None = None
    try:
        assert await orch.wait_for_agents(1, timeout=30.0) == 1
        syn = {"kind": "synthetic", "seconds": 2.0, "ref_gflops": 200.0}
        spec = PipelineSpec.model_validate({"name": "one", "tasks": [{"id": "x", "run": syn}]})
        await orch.submit_spec(spec, "one")
        run = orch.pipelines["one"]
        await orch.wait_for(lambda: run.tasks["x"].state == "started", timeout=10.0)
        os.kill(proc.pid, signal.SIGKILL)
        await orch.wait_for(lambda: any("cannot re-place" in x for x in run.placement_log), 10.0)
        cfg = agent_config("edge", "edge", **SLOW, devices=[device(200.0, 1)])
        late = RecordingAgent(nats_url, cfg, agent_id="v2", calibrate=False)
        await late.start()
        done = await orch.wait_terminal("one", timeout=15.0)  # well before a retry is due
        assert done.state == "succeeded", done.reason
        assert done.tasks["x"].agent_id == "v2" and not orch.recovery._stuck
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if late is not None:
            await late.stop()
        await orch.stop()


async def test_two_dead_agents_tasks_wait_for_room_and_are_placed_when_it_comes(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both agents running a pipeline die (kill -9) and no other is up: each death's
    re-placement finds no room and waits. When an agent joins, the retry re-places the tasks
    of both. Before, the second wait replaced the first (one per pipeline: the first agent's
    tasks were never placed again), and a retry looked for tasks their agents had given up
    instead of the dead agents' unfinished ones, and re-placed nothing: the pipeline never
    ended (found by `booking_stress --restart-agents-after`: 5 of 3,000 pipelines)."""
    monkeypatch.setattr(recovery, "STUCK_RETRY_S", 0.2)
    orch = Orchestrator(nats_url, name="orch")
    await orch.start()
    one_slot = [device(200.0, 1)]
    procs = {a: start_victim(nats_url, tmp_path, a, devices=one_slot) for a in ("v1", "v2")}
    late: subprocess.Popen[bytes] | None = None
    try:
        assert await orch.wait_for_agents(2, timeout=30.0) == 2
        syn = {"kind": "synthetic", "seconds": 2.0, "ref_gflops": 200.0}
        spec = PipelineSpec.model_validate(
            {"name": "two", "tasks": [{"id": "x", "run": syn}, {"id": "y", "run": syn}]}
        )
        await orch.submit_spec(spec, "two")
        run = orch.pipelines["two"]
        assert {tr.agent_id for tr in run.tasks.values()} == {"v1", "v2"}
        # running (the stall watchdog moves tasks that never started; not these)
        await orch.wait_for(
            lambda: all(tr.state == "started" for tr in run.tasks.values()), timeout=10.0
        )
        # both dead before either death's re-placement looks for room
        async with orch.recovery.lock("two"):
            for p in procs.values():
                os.kill(p.pid, signal.SIGKILL)
            async with asyncio.timeout(10.0):  # each verdict sets cluster_changed
                while True:
                    orch.cluster_changed.clear()
                    if all(orch.recovery.health.is_dead(a) for a in procs):
                        break
                    await orch.cluster_changed.wait()
        await orch.wait_for(
            lambda: sum("cannot re-place" in x for x in run.placement_log) == 1, timeout=10.0
        )
        assert len(orch.recovery._stuck) == 1  # one wait, for both agents' tasks
        [stuck] = orch.recovery._stuck.values()
        assert stuck.kind == "gone" and stuck.gone == {"v1", "v2"}
        late = start_victim(nats_url, tmp_path, "v3", devices=[device(200.0, 2)])
        done = await orch.wait_terminal("two", timeout=15.0)
        assert done.state == "succeeded", done.reason
        assert {tr.agent_id for tr in done.tasks.values()} == {"v3"}
        assert not orch.recovery._stuck
    finally:
        for p in [*procs.values(), *([late] if late is not None else [])]:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        await orch.stop()


async def test_a_producer_placed_again_goes_around_its_own_consumers_window(
    nats_url: str, tmp_path: Path
) -> None:
    """A dead agent's producer is placed again on the device where its consumer is booked
    and waits for it. The plan must go around that window, as the CAS write does: it keeps
    the pipeline's own windows of tasks it does not move. Planned through it, every round
    lost to the pipeline's own window, the placement gave up and waited for the periodic
    retry (booking_stress seed 401: a 12.2 s pipeline)."""
    configs = {"s1": agent_config("edge", "edge", **SLOW, devices=[device(100.0, 1)])}
    orch, agents = await start_cluster(nats_url, configs)
    proc = start_victim(nats_url, tmp_path, "victim")
    try:
        assert await orch.wait_for_agents(2, timeout=30.0) == 2
        syn = {"kind": "synthetic", "ref_gflops": 100.0, "output_bytes": 1000}
        spec = PipelineSpec.model_validate({"name": "around", "tasks": [
            {"id": "p", "run": {**syn, "seconds": 2.0}},  # 1 s on the victim, 2 s on s1
            {"id": "c", "run": {**syn, "seconds": 0.5}, "deps": ["p"],
             "requires": {"pinned_agent": "s1"}},
        ]})  # fmt: skip
        reply = await orch.submit_spec(spec, pipeline_id="around")
        run = orch.pipelines[reply.pipeline_id]
        assert {p.task_id: p.agent_id for p in reply.plan} == {"p": "victim", "c": "s1"}
        c_key, c_start, c_end = run.windows["c"]
        await orch.wait_for(lambda: run.tasks["p"].state == "started", timeout=10.0)
        os.kill(proc.pid, signal.SIGKILL)
        await orch.wait_for(lambda: run.tasks["p"].agent_id == "s1", timeout=10.0)
        # p now runs where c waits; its window is clear of c's, which stayed as it was
        p_key, p_start, p_end = run.windows["p"]
        assert p_key == c_key and run.windows["c"] == (c_key, c_start, c_end)
        assert p_start >= c_end - 1e-6 or p_end <= c_start + 1e-6
        assert run.conflicts == 0, run.placement_log
        done = await orch.wait_terminal(run.pipeline_id, timeout=20.0)
        assert done.state == "succeeded", done.reason
        assert not [line for line in run.placement_log if "conflict" in line]
    finally:
        await stop_with_victim(proc, orch, agents)


def first_placement_waits(
    orch: Orchestrator,
    monkeypatch: pytest.MonkeyPatch,
    target: set[str],
    meanwhile: Callable[[], Awaitable[None]],
) -> list[set[str] | None]:
    """The first placement of exactly `target` waits for `meanwhile` before it goes on;
    returns the list every placement's `only` is noted in."""
    place = orch.placer.place
    tried: list[set[str] | None] = []

    async def waits(r: PipelineRun, only: set[str] | None = None, **kw: Any) -> None:
        tried.append(only)
        if only == target and tried.count(target) == 1:
            await meanwhile()
        await place(r, only, **kw)

    monkeypatch.setattr(orch.placer, "place", waits)
    return tried


async def test_a_re_run_that_fails_after_its_consumer_ended_ends_the_pipeline(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead agent's finished producer is to run again for its consumer, which waits on a
    live agent; the re-run finds no room (it is pinned to the dead agent), and while it is
    tried the consumer, whose input had reached it before the death, ends. The failed
    re-placement puts the producer back as succeeded, so every task has: the pipeline must
    end as succeeded. It stayed running for good, every task succeeded (booking_stress seeds
    602/604 with the fleet restarted, its outputs still on disk)."""
    configs = {
        "s1": agent_config(
            "edge", "edge", **SLOW, devices=[device(100.0, 1)], started_event_after_s=60.0
        )
    }
    orch, agents = await start_cluster(nats_url, configs)
    s1 = agents[0]
    entered, gate = asyncio.Event(), asyncio.Event()

    async def gated(job: Any) -> None:
        if job.offer.task.id == "c":  # c has its input: it waits here until the test says
            entered.set()
            await gate.wait()

    s1.before_run = gated
    proc = start_victim(nats_url, tmp_path, "victim")
    try:
        assert await orch.wait_for_agents(2, timeout=30.0) == 2
        syn = {"kind": "synthetic", "ref_gflops": 100.0, "output_bytes": 1000, "seconds": 0.05}
        spec = PipelineSpec.model_validate({"name": "ended", "tasks": [
            {"id": "p", "run": syn, "requires": {"pinned_agent": "victim"}},
            {"id": "c", "run": syn, "deps": ["p"], "requires": {"pinned_agent": "s1"}},
        ]})  # fmt: skip
        reply = await orch.submit_spec(spec, pipeline_id="ended")
        run = orch.pipelines[reply.pipeline_id]
        await asyncio.wait_for(entered.wait(), 20.0)
        await orch.wait_for(lambda: run.tasks["p"].state == "succeeded", timeout=10.0)
        assert run.tasks["c"].state == "accepted"  # not heard started: it waits for p

        async def consumer_ends_first() -> None:  # c ends before p's re-run is known to fail
            gate.set()
            await orch.wait_for(lambda: run.tasks["c"].state == "succeeded", timeout=10.0)

        tried = first_placement_waits(orch, monkeypatch, {"p"}, consumer_ends_first)
        os.kill(proc.pid, signal.SIGKILL)
        done = await orch.wait_terminal(run.pipeline_id, timeout=20.0)
        log = "\n".join(run.placement_log)
        assert tried == [{"p"}], log
        assert done.state == "succeeded", log
        assert "cannot re-place" not in log and "nothing to re-run" in log, log
        assert [x[1] for x in s1.log] == ["c"]  # p never ran again: nothing waited for it
    finally:
        await stop_with_victim(proc, orch, agents)


async def test_an_end_heard_while_a_failed_re_placement_was_tried_is_applied(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead agent's task is to be placed again and cannot be (pinned there); while that is
    tried, the task's end under the placement being replaced arrives (as a restarted agent
    replays its journal: the event the dead incarnation wrote, published again). Stale while
    the task was taken from that placement, it is the put-back placement's own once the
    re-placement fails: heard then, it ends the pipeline. Dropped, the task waited on a
    placement that had ended until the stall watchdog asked about it and found its end in
    the stream (`stall_s`, 10 s by default; a minute here, so only the new path ends it)."""
    monkeypatch.setattr(recovery, "STUCK_RETRY_S", 60.0)  # no retry within the test
    orch, agents = await start_cluster(nats_url, {}, stall_s=60.0)
    proc = start_victim(nats_url, tmp_path, "victim")
    nc = await nats.connect(nats_url)
    try:
        assert await orch.wait_for_agents(1, timeout=30.0) == 1
        syn = {"kind": "synthetic", "ref_gflops": 100.0, "output_bytes": 0, "seconds": 5.0}
        spec = PipelineSpec.model_validate({"name": "late", "tasks": [
            {"id": "t", "run": syn, "requires": {"pinned_agent": "victim"}},
        ]})  # fmt: skip
        reply = await orch.submit_spec(spec, pipeline_id="late")
        run = orch.pipelines[reply.pipeline_id]
        token = run.tasks["t"].token

        async def end_arrives_meanwhile() -> None:
            before = run.stale_events
            end = TaskEvent(
                event_id="victim-journal-1", pipeline_id="late", task_id="t",
                agent_id="victim", incarnation="0123456789abcdef", device_id="cpu0",
                token=token, state="succeeded", duration_s=2.5,
            )  # fmt: skip
            await nc.jetstream().publish(subjects.task_event("late", "t", "victim"), encode(end))
            await orch.wait_for(lambda: run.stale_events > before, timeout=10.0)

        tried = first_placement_waits(orch, monkeypatch, {"t"}, end_arrives_meanwhile)
        os.kill(proc.pid, signal.SIGKILL)
        done = await orch.wait_terminal(run.pipeline_id, timeout=20.0)
        log = "\n".join(run.placement_log)
        assert tried == [{"t"}], log
        assert "cannot re-place t" in log, log  # the re-placement did fail
        assert done.state == "succeeded", log
        assert run.tasks["t"].token == token and run.stale_events == 0, log
        assert (await results(nats_url, run))["t"][0].token == token
    finally:
        await nc.close()
        await stop_with_victim(proc, orch, agents)
