"""Reservations over a real nats-server: CAS booking, fencing tokens, expiry, preemption."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from asyncio import Event
from pathlib import Path
from typing import Any

import nats
import pytest

from console.report import bookings_table
from edge_agent.config import AgentConfig
from edge_agent.executors import BUILTIN_MODELS
from orchestrator.placement.placer import PlacementFailed
from orchestrator.reservations.book import double_booked
from orchestrator.reservations.listing import read_bookings
from orchestrator.reservations.store import BUCKET, BookingStore, device_key
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, TaskEvent, subjects
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import decode, encode
from schemas.errors import ServiceError
from schemas.placement import EvictNotice, InputGone
from tests.harness import agent_config, start_cluster, stop_cluster
from tests.integration.test_failover import hold_renewals
from transport.client import Client
from transport.rpc import settle

pytestmark = pytest.mark.integration


def spec(name: str, tasks: list[dict[str, Any]], **kw: Any) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": name, "tasks": tasks, **kw})


def sleep_task(tid: str, seconds: float, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "run": {"kind": "synthetic", "seconds": seconds}, **kw}


def hold_end(orch: Orchestrator, pipeline_id: str, task_id: str) -> tuple[Event, Event]:
    """The task's end reaches its owner only when the test sets the second event (the first
    is set as it arrives): a short task's end still on its way."""
    ended, heard = asyncio.Event(), asyncio.Event()
    real = orch.apply_event

    async def late(ev: TaskEvent) -> None:
        if (ev.pipeline_id, ev.task_id, ev.state) == (pipeline_id, task_id, "succeeded"):
            ended.set()
            await heard.wait()
        await real(ev)

    orch.apply_event = late  # type: ignore[method-assign]
    return ended, heard


#: A task only the slow agent can run: the fast one, which the plan prefers, lacks its model
#: and rejects it (`missing_model`; plans cannot know which models an agent holds).
ONLY_ON_SLOW = {
    "id": "m",
    "run": {"kind": "onnx", "model": "only_here", "random_inputs": True},
    "profile": {"flops": 1e9},
}


def fast_rejects(tmp_path: Path, slow: dict[str, Any] | None = None) -> dict[str, AgentConfig]:
    """Agents "fast-no-model" (an emulated GPU) and "slow-has-model" (this host's CPU, or the
    emulated `slow` device), only the slow one holding ONLY_ON_SLOW's model."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "only_here.onnx").write_bytes((BUILTIN_MODELS / "tiny_cnn.onnx").read_bytes())
    fast = {"device_id": "gpu0", "kind": "gpu", "gflops": 500.0, "emulated": True}
    own = {"probe_cpu": False, "devices": [slow]} if slow is not None else {}
    return {
        "fast-no-model": agent_config("s", "edge", probe_cpu=False, devices=[fast]),
        "slow-has-model": agent_config("s", "edge", models_dir=str(models), **own),
    }


class History:
    """Every revision of every reservation key, checked as it arrives."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self.revisions: dict[str, list[int]] = {}
        self.count = 0

    async def watch(self, url: str, ready: asyncio.Event, stop: asyncio.Event) -> None:
        nc = await nats.connect(url)
        js = nc.jetstream()
        kv = await js.key_value(BUCKET)  # created by the orchestrators' start()
        watcher = await kv.watchall()
        ready.set()
        try:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    e = await watcher.updates(timeout=0.2)
                    if e is None or not e.value:
                        continue
                    self.count += 1
                    revs = self.revisions.setdefault(e.key, [])
                    if revs and e.revision <= revs[-1]:
                        self.violations.append(f"{e.key}: revision {e.revision} after {revs[-1]}")
                    revs.append(e.revision)
                    book = decode(e.value, DeviceBookings)
                    at = e.created.timestamp() if e.created else time.time()
                    self.violations += [
                        f"{e.key}@{e.revision}: {v}" for v in double_booked(book.windows, now=at)
                    ]
        finally:
            await watcher.stop()
            await nc.close()


async def test_two_orchestrators_booking_the_same_devices_never_overlap(nats_url: str) -> None:
    configs = {f"a{i}": agent_config("s", "edge", probe_cpu=False, devices=[
        {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": 10.0, "emulated": True}])
        for i in range(3)}  # fmt: skip
    orch1, agents = await start_cluster(nats_url, configs)
    orch2 = Orchestrator(nats_url, name="second")
    await orch2.start()
    assert await orch2.wait_for_agents(3, 10.0) == 3
    hist, ready, stop = History(), asyncio.Event(), asyncio.Event()
    watcher = asyncio.create_task(hist.watch(nats_url, ready, stop))
    await ready.wait()
    try:
        specs = [
            spec(
                f"p{i}",
                [
                    sleep_task("a", 0.03),
                    sleep_task("b", 0.03, deps=["a"]),
                    sleep_task("c", 0.03, deps=["a"]),
                ],
            )
            for i in range(24)
        ]
        replies = await asyncio.gather(*(
            (orch1 if i % 2 else orch2).submit_spec(s, f"pipe{i}") for i, s in enumerate(specs)
        ))  # fmt: skip
        assert all(r.state == "running" for r in replies)
        for i in range(24):
            owner = orch1 if i % 2 else orch2
            run = await owner.wait_terminal(f"pipe{i}", 30)
            assert run.state == "succeeded", run.reason
        # the two replicas really raced for the same keys
        total_conflicts = sum(
            r.conflicts + r.cas_retries for o in (orch1, orch2) for r in o.pipelines.values()
        )
        assert hist.count >= 24
        assert hist.violations == []
        print(f"revisions={hist.count} conflicts+retries={total_conflicts}")  # for the log
    finally:
        stop.set()
        await watcher
        await orch2.stop()
        await stop_cluster(orch1, agents)


async def test_an_agent_that_rejects_gets_its_task_placed_elsewhere(
    nats_url: str, tmp_path: Path
) -> None:
    orch, agents = await start_cluster(nats_url, fast_rejects(tmp_path))
    try:
        s = spec("rej", [ONLY_ON_SLOW])
        reply = await orch.submit_spec(s, "rej-1")
        assert [p.agent_id for p in reply.plan] == ["slow-has-model"]
        run = await orch.wait_terminal("rej-1", 20)
        assert run.state == "succeeded", run.reason
        assert run.rejections == 1
        assert any(
            "fast-no-model rejected m (missing_model" in line for line in run.placement_log
        ), run.placement_log
    finally:
        await stop_cluster(orch, agents)


async def test_a_task_event_under_another_pipelines_subject_is_ignored(nats_url: str) -> None:
    """An event is applied only to the pipeline its subject names (a forged failure, right
    token and agent, published as another pipeline's event, changes nothing)."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge")})
    nc = await nats.connect(nats_url)
    try:
        await orch.submit_spec(spec("sub", [sleep_task("slow", 0.3)]), "sub-1")
        task = orch.pipelines["sub-1"].tasks["slow"]
        forged = TaskEvent(
            event_id="forged-2", pipeline_id="sub-1", task_id="slow",
            agent_id=task.agent_id or "", incarnation=agents[0].incarnation, device_id="cpu0",
            token=task.token, state="failed", error="published under another name",
        )  # fmt: skip
        await nc.publish(subjects.task_event("other-1", "slow", forged.agent_id), encode(forged))
        await settle(nc)
        done = await orch.wait_terminal("sub-1", 10)
        assert done.state == "succeeded", done.reason
        assert done.tasks["slow"].error == ""
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_stale_tokens_result_is_ignored(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge")})
    nc = await nats.connect(nats_url)
    try:
        await orch.submit_spec(spec("st", [sleep_task("slow", 0.5)]), "st-1")
        run = orch.pipelines["st-1"]
        task = run.tasks["slow"]
        forged = TaskEvent(
            event_id="forged-1",
            pipeline_id="st-1",
            task_id="slow",
            agent_id=task.agent_id or "",
            incarnation="old",
            device_id="cpu0",
            token=task.token - 1,
            state="failed",
            error="from an old placement",
        )
        await nc.publish(subjects.task_event("st-1", "slow", forged.agent_id), encode(forged))
        await settle(nc)
        done = await orch.wait_terminal("st-1", 10)
        assert done.state == "succeeded"
        assert done.stale_events >= 1
        assert done.tasks["slow"].error == ""
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_expired_bookings_of_a_dead_orchestrator_are_reclaimed(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=1)})
    nc = await nats.connect(nats_url)
    try:
        dead = BookingStore(nc.jetstream())
        await dead.start()
        key = device_key("a", "cpu0")
        expires = time.time() + 0.3
        ghost = BookingWindow(
            pipeline_id="ghost",
            task_id="g",
            slot=0,
            start=time.time(),
            end=time.time() + 3600,
            expires=expires,
            owner="dead",
        )
        assert (await dead.book(key, [ghost], time.time())).ok
        await asyncio.sleep(max(0.0, expires - time.time()) + 0.05)  # let the lease run out
        reply = await orch.submit_spec(spec("after", [sleep_task("x", 0.01)]), "after-1")
        assert reply.plan[0].start_s < 1.0  # not queued behind the hour-long ghost
        run = await orch.wait_terminal("after-1", 10)
        assert run.state == "succeeded"
        entry = await (await nc.jetstream().key_value(BUCKET)).get(key)
        assert all(
            w.pipeline_id != "ghost" for w in decode(entry.value or b"", DeviceBookings).windows
        )
        await dead.stop()
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_preemption_evicts_only_preemptible_lower_priority_work(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, {"b": agent_config("s", "edge", cpu_slots=1)})
    try:
        await orch.submit_spec(spec("r", [sleep_task("r", 0.6)]), "running")
        low = await orch.submit_spec(
            spec("l", [sleep_task("l", 0.2)], priority=10, preemptible=True), "low"
        )
        firm = await orch.submit_spec(spec("m", [sleep_task("m", 0.2)], priority=10), "firm")
        assert low.plan[0].start_s < firm.plan[0].start_s  # queued behind "running", in order
        high = await orch.submit_spec(spec("h", [sleep_task("h", 0.1)], priority=500), "high")
        pipes = orch.pipelines

        def at(pid: str, start_s: float) -> float:  # the booking clock
            return pipes[pid].t0 + start_s

        # "high" took the preemptible low-priority window, and not the firm one's
        assert at("high", high.plan[0].start_s) == pytest.approx(
            at("low", low.plan[0].start_s), abs=0.05
        )
        assert at("high", high.plan[0].finish_s) <= at("firm", firm.plan[0].start_s) + 1e-3
        # "low" was told and re-placed after "high"
        await orch.wait_for(
            lambda: any("re-placed after eviction" in x for x in pipes["low"].placement_log), 5
        )
        moved = pipes["low"].placements["l"]
        assert pipes["low"].t0 + moved.start >= at("high", high.plan[0].finish_s) - 1e-3
        runs = {p: await orch.wait_terminal(p, 15) for p in ("running", "low", "firm", "high")}
        assert all(r.state == "succeeded" for r in runs.values()), {
            p: r.reason for p, r in runs.items()
        }
        assert any("evicted" in line for line in runs["low"].placement_log)
        for p in ("running", "firm", "high"):
            assert not any("evicted" in line for line in runs[p].placement_log), p
        started = {p: r.tasks[next(iter(r.tasks))].started_s for p, r in runs.items()}
        assert started["high"] is not None and started["low"] is not None
        assert orch.pipelines["high"].committed_at is not None
    finally:
        await stop_cluster(orch, agents)


async def test_a_started_tasks_window_is_not_taken(nats_url: str) -> None:
    """ "l", of a preemptible low-priority pipeline, has started on b (its start heard at
    once); a running task is never stopped for a higher priority, so its window is made
    non-preemptible, and "h" (priority 500, b only) is planned after it instead of taking
    its time and then waiting for it on b."""
    quiet = {"cpu_slots": 1, "started_event_after_s": 0.0}
    orch, agents = await start_cluster(nats_url, {"b": agent_config("s", "edge", **quiet)})
    try:
        await orch.submit_spec(
            spec("l", [sleep_task("l", 2.0)], priority=10, preemptible=True), "low"
        )
        low = orch.pipelines["low"]
        key, _, end = low.windows["l"]

        def held() -> bool:
            cur = orch.store.cache.get(key)
            return cur is not None and any(
                w.task_id == "l" and not w.preemptible for w in cur.book.windows
            )

        await orch.store.wait_until(held, 10.0)  # its start heard, and the window rewritten
        assert low.tasks["l"].state == "started" and orch.displaced.windows_held == 1
        high = await orch.submit_spec(spec("h", [sleep_task("h", 0.1)], priority=500), "high")
        assert orch.pipelines["high"].t0 + high.plan[0].start_s >= end - 1e-3  # after l
        runs = {p: await orch.wait_terminal(p, 15) for p in ("low", "high")}
        assert all(r.state == "succeeded" for r in runs.values())
        assert orch.displaced.evictions_seen == 0
        assert not any("evicted" in x for x in runs["low"].placement_log)
        assert f"l started: its window on {key} is no longer preemptible" in (
            runs["low"].placement_log
        )
        assert runs["low"].tasks["l"].token == low.tasks["l"].token  # never moved
    finally:
        await stop_cluster(orch, agents)


async def test_an_evicted_task_takes_what_waits_for_it_along(nats_url: str) -> None:
    """ "p" and its consumer "c" queue on b behind a running task; "h" (priority 500) takes
    p's window. p is booked again after h, and c, still waiting, after p: before, c's window
    stayed where it was, so p's new one overlapped its own consumer's, which no eviction may
    take, and the re-placement lost every round to itself and gave up."""
    orch, agents = await start_cluster(nats_url, {"b": agent_config("s", "edge", cpu_slots=1)})
    try:
        await orch.submit_spec(spec("r", [sleep_task("r", 1.0)]), "busy")
        low = spec("l", [sleep_task("p", 0.3), sleep_task("c", 0.3, deps=["p"])],
                   priority=10, preemptible=True)  # fmt: skip
        await orch.submit_spec(low, "low")
        run = orch.pipelines["low"]
        tokens = {t: run.tasks[t].token for t in ("p", "c")}
        high = await orch.submit_spec(spec("h", [sleep_task("h", 0.2)], priority=500), "high")
        moved = "re-placed after eviction: p; c booked again after"
        await orch.wait_for(lambda: moved in run.placement_log, 10.0)
        assert not any("conflict" in x or "failed" in x for x in run.placement_log), (
            run.placement_log
        )
        assert all(run.tasks[t].token > tokens[t] for t in ("p", "c"))
        p, c = run.windows["p"], run.windows["c"]
        h_end = orch.pipelines["high"].t0 + high.plan[0].finish_s
        assert h_end - 1e-3 <= p[1] < p[2] <= c[1] + 1e-3  # h, then p, then c
        runs = {x: await orch.wait_terminal(x, 15) for x in ("busy", "low", "high")}
        assert all(r.state == "succeeded" for r in runs.values())
    finally:
        await stop_cluster(orch, agents)


async def test_an_eviction_heard_while_the_lease_had_lapsed_is_acted_on_once_renewed(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The notice that "h" took p's window comes while low's ownership lease has lapsed here
    (the server away, or JetStream slow just after it came back) and is still this replica's:
    it is kept, and acted on once the lease is renewed. Before, it was dropped as "not ours to
    act on", and p waited without a window for two window audits (5-10 s at the default lease)."""
    orch, agents = await start_cluster(nats_url, {"b": agent_config("s", "edge", cpu_slots=1)})
    renewing = hold_renewals(orch, monkeypatch)
    parked = asyncio.Event()
    park = orch.displaced.park

    def parking(note: EvictNotice | InputGone) -> bool:
        kept = park(note)
        if kept and note.pipeline_id == "low":
            parked.set()
        return kept

    monkeypatch.setattr(orch.displaced, "park", parking)
    try:
        await orch.submit_spec(spec("r", [sleep_task("r", 3.0)]), "busy")  # p, c queue behind
        low = spec("l", [sleep_task("p", 0.3), sleep_task("c", 0.3, deps=["p"])],
                   priority=10, preemptible=True)  # fmt: skip
        await orch.submit_spec(low, "low")
        run = orch.pipelines["low"]
        orch.failover.leases.held["low"].valid_until = orch.mono()  # an unrenewed lease's lot
        assert orch.failover.holds("low") and not orch.failover.may_act("low")
        await orch.submit_spec(spec("h", [sleep_task("h", 0.2)], priority=500), "high")
        await asyncio.wait_for(parked.wait(), 5.0)
        assert not any("evicted" in x for x in run.placement_log)  # not acted on yet
        assert orch.displaced.parked == 1
        renewing.set()
        moved = "re-placed after eviction: p; c booked again after"
        await orch.wait_for(lambda: moved in run.placement_log, 5.0)
        assert orch.displaced.parked == 0 and orch.displaced.windows_lost == 0  # not the audit's
        runs = {x: await orch.wait_terminal(x, 15) for x in ("busy", "low", "high")}
        assert all(r.state == "succeeded" for r in runs.values())
    finally:
        renewing.set()
        await stop_cluster(orch, agents)


async def test_each_eviction_makes_a_tasks_next_window_harder_to_take(nats_url: str) -> None:
    """ "l" (priority 10, preemptible) queues on b behind a running task. "h1" (priority 500)
    takes its window; l's next window carries that eviction, and ranks EVICTION_POINTS
    higher: "m" (priority 100, above l's own 10 plus a second or two of aging) is planned
    around it instead of taking it, while "h2" (priority 300) still may."""
    orch, agents = await start_cluster(nats_url, {"b": agent_config("s", "edge", cpu_slots=1)})
    try:
        await orch.submit_spec(spec("r", [sleep_task("r", 1.5)]), "busy")
        await orch.submit_spec(
            spec("l", [sleep_task("l", 0.3)], priority=10, preemptible=True), "low"
        )
        run = orch.pipelines["low"]
        key = run.windows["l"][0]

        def booked_evictions() -> int | None:
            cur = orch.store.cache.get(key)
            return next(
                (w.evictions for w in cur.book.windows if (w.pipeline_id, w.task_id)
                 == ("low", "l") and w.expires > orch.wall()),
                None,
            ) if cur is not None else None  # fmt: skip

        assert booked_evictions() == 0
        await orch.submit_spec(spec("h1", [sleep_task("h1", 0.1)], priority=500), "h1")
        await orch.wait_for(lambda: "re-placed after eviction: l" in run.placement_log, 10.0)
        assert run.evictions == {"l": 1}
        await orch.store.wait_until(lambda: booked_evictions() == 1, 5.0)
        token = run.tasks["l"].token
        await orch.submit_spec(spec("m", [sleep_task("m", 0.1)], priority=100), "mid")
        assert run.tasks["l"].token == token and orch.displaced.evictions_seen == 1
        assert orch.pipelines["mid"].windows["m"][1] >= run.windows["l"][2] - 1e-3  # after l
        await orch.submit_spec(spec("h2", [sleep_task("h2", 0.1)], priority=300), "h2")
        await orch.wait_for(lambda: run.evictions == {"l": 2}, 10.0)
        await orch.store.wait_until(lambda: booked_evictions() == 2, 5.0)
        assert orch.js is not None  # and `mars bookings` shows it
        listed = bookings_table(await read_bookings(orch.js, pipeline="low"), orch.wall())
        assert "low/l" in listed and "yes, evicted 2x" in listed, listed
        runs = {p: await orch.wait_terminal(p, 15) for p in ("busy", "low", "h1", "mid", "h2")}
        assert all(r.state == "succeeded" for r in runs.values()), {
            p: r.reason for p, r in runs.items()
        }
        assert not any("evicted" in x for x in runs["mid"].placement_log)
    finally:
        await stop_cluster(orch, agents)


async def test_evicting_a_stale_window_leaves_the_task_where_it_is(nats_url: str) -> None:
    """A window left on b's key by an earlier placement of "l" (now queued on a) is taken by
    a higher-priority pipeline: the notice names "l", but "l" was not displaced, so it keeps
    its place (and its token) instead of being re-placed. Notices that name a task the
    pipeline lacks, or one whose window is still booked, move nothing either, and one under
    another pipeline's subject is dropped."""
    slot1 = {"cpu_slots": 1}
    orch, agents = await start_cluster(
        nats_url, {"a": agent_config("s", "edge", **slot1), "b": agent_config("s", "edge", **slot1)}
    )
    nc = await nats.connect(nats_url)
    try:
        await orch.submit_spec(
            spec("r", [sleep_task("r", 0.8, requires={"pinned_agent": "a"})]), "busy"
        )
        await orch.submit_spec(
            spec(
                "l",
                [sleep_task("l", 0.1, requires={"pinned_agent": "a"})],
                priority=10,
                preemptible=True,
            ),
            "low",
        )
        low = orch.pipelines["low"]
        placed, token = low.placements["l"], low.tasks["l"].token
        assert placed.device_id.startswith("a:")
        leftover = BookingStore(nc.jetstream())
        await leftover.start()
        now = time.time()
        stale = BookingWindow(
            pipeline_id="low", task_id="l", slot=0, start=now, end=now + 5, expires=now + 30,
            owner=orch.owner, priority=10, preemptible=True, submitted=now,
        )  # fmt: skip
        assert (await leftover.book(device_key("b", "cpu0"), [stale], now)).ok
        await leftover.stop()
        await orch.submit_spec(
            spec("h", [sleep_task("h", 0.05, requires={"pinned_agent": "b"})], priority=500), "high"
        )

        def answered() -> bool:
            return any("stale" in x or "after eviction" in x for x in low.placement_log)

        await orch.wait_for(answered, 5)
        assert any("evicted windows of l were stale" in x for x in low.placement_log)
        assert not any("re-placed after eviction" in x for x in low.placement_log)
        assert low.placements["l"] == placed and low.tasks["l"].token == token
        # one naming "l" where it is, published under another pipeline's subject, is dropped
        forged = EvictNotice(
            pipeline_id="low", task_ids=["l"], device=device_key("a", "cpu0"), by_pipeline="x"
        )
        await nc.publish(subjects.eviction("busy"), encode(forged))
        # a notice naming a task the pipeline does not have moves nothing either (handled
        # after the one before: one subscription, in order)
        bogus = EvictNotice(
            pipeline_id="low", task_ids=["nope"], device="dev.b.cpu0", by_pipeline="x"
        )
        await nc.publish(subjects.eviction("low"), encode(bogus))
        await orch.wait_for(lambda: any("of nope were stale" in x for x in low.placement_log), 5)
        assert not any("still booked" in x for x in low.placement_log)
        # nor one naming "l" where it is, its window untouched (heard twice, or not true)
        await nc.publish(subjects.eviction("low"), encode(forged))
        await orch.wait_for(lambda: any("still booked" in x for x in low.placement_log), 5)
        assert any("l still booked on dev.a.cpu0: not moved" in x for x in low.placement_log)
        assert low.placements["l"] == placed and low.tasks["l"].token == token
        runs = {p: await orch.wait_terminal(p, 15) for p in ("busy", "low", "high")}
        assert all(r.state == "succeeded" for r in runs.values())
        assert runs["low"].tasks["l"].token == token
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_an_eviction_is_noted_after_what_held_the_pipeline_meanwhile(
    nats_url: str,
) -> None:
    """A notice that arrives while a re-placement of the pipeline holds it (a dead agent's
    task placed again, its new window the one taken) is noted once that re-placement is
    done, after its note: the log says what happened in the order it was handled. Noted on
    arrival, it came before the re-placement that booked the window it names, and the log
    read as a firm window of the task's earlier, started placement taken (booking_stress
    seed 519, "evicted after" 1)."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge")})
    nc = await nats.connect(nats_url)
    try:
        await orch.submit_spec(
            spec("l", [sleep_task("l", 5.0)], priority=10, preemptible=True), "low"
        )
        low = orch.pipelines["low"]
        notice = EvictNotice(
            pipeline_id="low", task_ids=["l"], device=device_key("a", "cpu0"), by_pipeline="hi",
            reason="preempted by higher-priority hi",
        )  # fmt: skip
        async with orch.recovery.lock("low"):  # a re-placement under way
            await nc.publish(subjects.eviction("low"), encode(notice))
            await settle(nc)
            assert orch.nc is not None
            await orch.nc.flush()  # (the notice has reached the orchestrator's connection)
            await settle(orch.nc)
            low.note("re-placed l (as a recovery notes it)")
        await orch.wait_for(lambda: any("evicted from" in x for x in low.placement_log), 5)
        lines = [x for x in low.placement_log if "evicted from" in x or "as a recovery" in x]
        assert lines[0] == "re-placed l (as a recovery notes it)", low.placement_log
        assert lines[1].startswith("evicted from dev.a.cpu0: l")
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_window_gone_without_a_notice_is_booked_again(nats_url: str) -> None:
    """ "l" waits on a, its window gone from a's key with no notice heard (an eviction sent
    while another replica owned the pipeline, or a lease that lapsed): the owner's audit,
    after each renewal, finds it missing twice and places "l" again, booked anew."""
    slot1 = {"cpu_slots": 1}
    orch, agents = await start_cluster(
        nats_url,
        {"a": agent_config("s", "edge", **slot1), "b": agent_config("s", "edge", **slot1)},
        lease_s=0.6,  # a renewal, and an audit, every 0.2 s
    )
    nc = await nats.connect(nats_url)
    try:
        on_a = {"pinned_agent": "a"}
        await orch.submit_spec(spec("r", [sleep_task("r", 3.0, requires=on_a)]), "busy")
        await orch.submit_spec(
            spec("l", [sleep_task("l", 0.1, requires=on_a)], priority=10, preemptible=True),
            "low",
        )
        low = orch.pipelines["low"]
        token = low.tasks["l"].token
        key = device_key("a", "cpu0")
        other = BookingStore(nc.jetstream())
        await other.start()
        await other.release(key, "low", time.time(), ["l"])  # taken, and nobody told
        await other.stop()

        await orch.wait_for(
            lambda: any("re-placed after a lost window: l" in x for x in low.placement_log), 10
        )
        assert any("windows gone" in x and "l on a:cpu0" in x for x in low.placement_log)
        assert low.tasks["l"].token > token and orch.displaced.windows_lost == 1
        entry = await (await nc.jetstream().key_value(BUCKET)).get(key)
        ours = [
            w for w in decode(entry.value or b"", DeviceBookings).windows
            if (w.pipeline_id, w.task_id) == ("low", "l")
        ]  # fmt: skip
        assert len(ours) == 1, ours  # booked again (behind "r": it is pinned there)
        runs = {p: await orch.wait_terminal(p, 15) for p in ("busy", "low")}
        assert all(r.state == "succeeded" for r in runs.values())
        assert not any("windows gone" in x for x in runs["busy"].placement_log)
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_an_adopted_pipelines_lost_window_is_booked_again(nats_url: str) -> None:
    """The owner of "low" stops (frozen or cut off) and "l"'s window is taken meanwhile,
    with no notice anyone acts on; the replica that adopts "low" has no record of its windows
    but its placements, and its audit books "l" again."""
    slot1 = {"cpu_slots": 1}
    first, agents = await start_cluster(
        nats_url, {"a": agent_config("s", "edge", **slot1), "b": agent_config("s", "edge", **slot1)}
    )
    second = Orchestrator(nats_url, name="second", lease_s=0.6)  # audits every 0.2 s
    await second.start()
    nc = await nats.connect(nats_url)
    try:
        assert await second.wait_for_agents(2, 10.0) == 2
        on_a = {"pinned_agent": "a"}
        await first.submit_spec(spec("r", [sleep_task("r", 8.0, requires=on_a)]), "busy")
        await first.submit_spec(spec("l", [sleep_task("l", 0.1, requires=on_a)]), "low")
        token = first.pipelines["low"].tasks["l"].token
        first.failover.suspend()  # it stops renewing its ownership leases
        other = BookingStore(nc.jetstream())
        await other.start()
        await other.release(device_key("a", "cpu0"), "low", time.time(), ["l"])
        await other.stop()

        def rebooked() -> bool:
            run = second.pipelines.get("low")
            return run is not None and any("after a lost window: l" in x for x in run.placement_log)

        await second.wait_for(rebooked, 15.0)
        low = second.pipelines["low"]
        assert any("adopted by second" in x for x in low.placement_log)
        assert low.tasks["l"].token > token and second.displaced.windows_lost == 1
        assert first.displaced.windows_lost == 0  # its lease had lapsed: not its to act on
        run = await second.wait_terminal("low", 20.0)
        assert run.state == "succeeded", run.reason
    finally:
        await nc.close()
        await second.stop()
        await stop_cluster(first, agents)


async def test_an_evicted_task_that_already_ran_is_not_run_again(nats_url: str) -> None:
    """ "l" ran on b, but its end has not reached the owner (a short task reports only its
    end), which still holds it as waiting. Evicted, it is offered to b again naming the
    placement it replaces; b has run that one and refuses, so "l" keeps its placement and
    runs once, instead of twice (its first result then dropped as stale)."""
    dev = {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": 1.0, "emulated": True}
    quiet = {
        "probe_cpu": False, "devices": [dev], "started_event_after_s": 60.0,
        "python_allow": ["edge_agent.builtin_tasks"], "allowed_kinds": ["synthetic", "python"],
    }  # fmt: skip
    orch, agents = await start_cluster(nats_url, {"b": agent_config("s", "edge", **quiet)})
    ended, heard = hold_end(orch, "low", "l")
    try:
        quick = {"kind": "python", "entry": "edge_agent.builtin_tasks:checksum"}  # runs in ms
        low = spec("l", [{"id": "l", "run": quick, "profile": {"est_seconds": 3.0}}],
                   priority=10, preemptible=True)  # fmt: skip
        await orch.submit_spec(low, "low")
        run = orch.pipelines["low"]
        token = run.tasks["l"].token
        await asyncio.wait_for(ended.wait(), 10.0)  # it ran on b; the owner does not know
        assert run.tasks["l"].state in ("offered", "accepted")
        high = spec("h", [{"id": "h", "run": quick, "profile": {"est_seconds": 1.0}}], priority=500)
        await orch.submit_spec(high, "high")
        await orch.wait_for(lambda: any("kept as it was" in x for x in run.placement_log), 10.0)
        assert any("l already ran on b; kept as it was" in x for x in run.placement_log)
        assert run.tasks["l"].token == token and run.placements["l"].device_id == "b:cpu0"
        heard.set()
        done = await orch.wait_terminal("low", 10.0)
        assert done.state == "succeeded", done.reason
        assert done.stale_events == 0  # its one result, under its one token
        assert [x[1] for x in agents[0].log].count("l") == 1
        assert (await orch.wait_terminal("high", 10.0)).state == "succeeded"
    finally:
        heard.set()
        await stop_cluster(orch, agents)


#: A python task that runs in milliseconds, whatever its profile says.
QUICK = {"kind": "python", "entry": "edge_agent.builtin_tasks:checksum"}


def p_feeds_l(p_est_s: float, l_s: float, pinned_p: bool = False) -> PipelineSpec:
    """A low-priority preemptible pipeline: quick "p" (planned as `p_est_s`, on b if
    `pinned_p`), then "l" sleeping `l_s` at 1 GFLOP/s."""
    return spec("l", [
        {"id": "p", "run": QUICK, "profile": {"est_seconds": p_est_s},
         "requires": {"pinned_agent": "b"} if pinned_p else {}},
        {"id": "l", "run": {"kind": "synthetic", "seconds": l_s, "ref_gflops": 1.0},
         "deps": ["p"]},
    ], priority=10, preemptible=True)  # fmt: skip


def b_and_slower_c() -> dict[str, AgentConfig]:
    """Agents "b" and "c", one slot each, c half as fast; starts not reported (60 s), and the
    quick python task allowed."""

    def dev(gflops: float) -> dict[str, Any]:
        return {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": gflops, "emulated": True}

    quiet = {
        "probe_cpu": False, "started_event_after_s": 60.0,
        "python_allow": ["edge_agent.builtin_tasks"], "allowed_kinds": ["synthetic", "python"],
    }  # fmt: skip
    return {
        "b": agent_config("s", "edge", devices=[dev(1.0)], **quiet),
        "c": agent_config("s", "edge", devices=[dev(0.5)], **quiet),
    }


@pytest.mark.parametrize("pinned", [True, False])
async def test_an_evicted_task_already_running_keeps_running(nats_url: str, pinned: bool) -> None:
    """ "l" (fed by "p", both on b) is running, its start not reported yet, and "p"'s end has
    not reached the owner. Evicted, "l" is offered to b again (it has an input: it stays) naming
    the placement it replaces; b is running that one and refuses, so "l" keeps running there.
    Before, b's `duplicate` sent "l" to c, the run on b was killed, and "p", its output used up
    by that run, ran again for the new one. "p", evicted too, is kept as it was: pinned to b,
    because b says it ran it; free to go, offered to c and taken there, because "l" started,
    so "p" had ended (before, it ran a second time on c)."""

    orch, agents = await start_cluster(nats_url, b_and_slower_c())  # l takes twice as long on c
    ended, heard = hold_end(orch, "low", "p")
    try:
        await orch.submit_spec(p_feeds_l(0.5, 1.5, pinned_p=pinned), "low")
        run = orch.pipelines["low"]
        assert run.placements["l"].device_id == run.placements["p"].device_id == "b:cpu0"
        token = run.tasks["l"].token
        await asyncio.wait_for(ended.wait(), 10.0)
        job = agents[0].core.jobs.get(("low", "l"))
        await orch.wait_for(lambda: job is not None and job.state == "running", 10.0)
        assert run.tasks["l"].state in ("offered", "accepted")  # as the owner knows it
        high = spec("h", [{"id": "h", "run": QUICK, "profile": {"est_seconds": 1.0},
                           "requires": {"pinned_agent": "b"}}], priority=500)  # fmt: skip
        await orch.submit_spec(high, "high")
        moved = "re-placed after eviction: l, p"  # p's window went too (it ran: kept)
        await orch.wait_for(lambda: moved in run.placement_log, 10.0)
        assert any("l is running on b; kept as it was" in x for x in run.placement_log), (
            run.placement_log
        )
        p_kept = "p already ran on b" if pinned else "p has ended (what it feeds started)"
        assert any(f"{p_kept}; kept as it was" in x for x in run.placement_log), run.placement_log
        assert run.tasks["l"].token == token and run.placements["l"].device_id == "b:cpu0"
        # its window went to "h", but it waits for nothing: the audit leaves it be
        assert [await orch.displaced.audit_windows() for _ in range(3)] == [0, 0, 0]
        heard.set()
        done = await orch.wait_terminal("low", 15.0)
        assert done.state == "succeeded", done.reason
        assert done.stale_events == 0  # l's one result, under its one token
        ran = [
            (name, x[1]) for name, a in zip("bc", agents, strict=True) for x in a.log
            if x[0] == "low"
        ]  # fmt: skip
        assert sorted(ran) == [("b", "l"), ("b", "p")]  # each once, on b
        assert (await orch.wait_terminal("high", 15.0)).state == "succeeded"
    finally:
        heard.set()
        await stop_cluster(orch, agents)


async def test_a_producer_whose_place_a_round_took_runs_again_not_never(nats_url: str) -> None:
    """ "p" ran on b (its end not heard) and "l" runs on b with its output (its start not
    heard); p's record was then moved to c, where nothing ran it. A round that places both
    again finds l running (kept), so p had ended; but the round's offer for p went to c and
    replaced p's job there. Kept "as it was" (on c, under the replaced token) and the
    round's offer withdrawn, p was left with no job anywhere: its pipeline waited for an end
    that could not come, until the stall watchdog (seen once in the long-task stress: 22 s).
    It stays where the round put it and runs there again."""

    orch, agents = await start_cluster(nats_url, b_and_slower_c())
    ended, heard = hold_end(orch, "low", "p")
    try:
        await orch.submit_spec(p_feeds_l(0.2, 3.0), "low")
        run = orch.pipelines["low"]
        assert run.placements["l"].device_id == run.placements["p"].device_id == "b:cpu0"
        await asyncio.wait_for(ended.wait(), 10.0)
        job = agents[0].core.jobs.get(("low", "l"))
        await orch.wait_for(lambda: job is not None and job.state == "running", 10.0)
        # p's record moves to c (offered there, not committed: nothing runs it)
        await orch.placer.place(run, only={"p"}, exclude={("p", "b:cpu0")})
        assert run.placements["p"].device_id == "c:cpu0"
        moved = run.tasks["p"].token
        assert agents[1].core.jobs[("low", "p")].offer.token == moved
        # both placed again: l stays on b (running: kept), p goes to c again
        await orch.placer.place(run, only={"p", "l"}, exclude={("p", "b:cpu0"), ("l", "c:cpu0")})
        job_p = agents[1].core.jobs.get(("low", "p"))  # the job its record names is there
        assert job_p is not None and job_p.offer.token == run.tasks["p"].token
        assert run.placements["p"].device_id == "c:cpu0" and run.tasks["p"].token > moved
        assert any("l is running on b; kept as it was" in x for x in run.placement_log)
        assert any(
            "p has ended (what it feeds started), but this round's offer took its place "
            "on c: it runs there again" in x
            for x in run.placement_log
        ), run.placement_log
        await orch.commits.commit_all(run, {"p", "l"})
        heard.set()
        done = await orch.wait_terminal("low", 15.0)
        assert done.state == "succeeded", done.reason
        assert [x[1] for x in agents[1].log if x[0] == "low"] == ["p"]  # run again on c
    finally:
        heard.set()
        await stop_cluster(orch, agents)


async def test_a_re_placement_the_pipeline_ends_under_gives_back_what_it_booked(
    nats_url: str,
) -> None:
    """A re-placement of "t" (to the agent it is not on) books after the pipeline has ended
    (its end heard while the round waited): it offers nothing, and what it booked goes back
    at once. Before, the round went on, offered "t" to the other agent (which ran it again)
    and its window stayed on that key until its lease ran out (found by the stress with a
    replica killed: windows live 15 s after the last pipeline ended)."""
    one = {"cpu_slots": 1}
    orch, agents = await start_cluster(
        nats_url, {"b": agent_config("s", "edge", **one), "c": agent_config("s", "edge", **one)}
    )
    try:
        await orch.submit_spec(spec("p", [sleep_task("t", 0.2)]), "p1")
        run = orch.pipelines["p1"]
        here = run.placements["t"].device_id
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        placing = asyncio.ensure_future(
            orch.placer.place(run, only={"t"}, exclude={("t", here)}, gate=gate)
        )
        await orch.wait_terminal("p1", 10.0)  # it ends while the round waits to book
        gate.set_result(None)
        with pytest.raises(PlacementFailed, match="ended while placed"):
            await placing

        def booked() -> bool:
            return any(
                w.pipeline_id == "p1" for cur in orch.store.cache.values() for w in cur.book.windows
            )

        await orch.store.wait_until(lambda: not booked(), 5.0)
        assert all(("p1", "t") not in a.core.jobs for a in agents)  # nothing offered
        assert run.state == "succeeded" and run.placements["t"].device_id == here
    finally:
        await stop_cluster(orch, agents)


async def test_status_of_another_replicas_pipeline_comes_from_kv(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge")})
    other = Orchestrator(nats_url, name="other")
    await other.start()
    client = await Client.connect(nats_url)
    try:
        await orch.submit_spec(spec("kv", [sleep_task("x", 0.01)]), "kv-1")
        await orch.wait_terminal("kv-1", 10)
        st = await other.status_of("kv-1")
        assert st.state == "succeeded" and st.owner == orch.owner
        # rebuilt from the owner's record: what the owner itself answers, clocks aside
        mine = await orch.status_of("kv-1")
        assert st.model_dump(exclude={"elapsed_s"}) == mine.model_dump(exclude={"elapsed_s"})
        assert abs(st.elapsed_s - mine.elapsed_s) < 0.05
        with pytest.raises(ServiceError) as err:
            await other.status_of("never-submitted")
        assert err.value.code == "not_found"
    finally:
        await client.close()
        await other.stop()
        await stop_cluster(orch, agents)


async def test_a_pipeline_another_replica_owns_is_answered_not_placed_again(
    nats_url: str,
) -> None:
    """The same id and spec sent to a second replica: its ownership claim fails, and it
    answers with the owner's plan without booking or offering anything (the claim is awaited
    before the first booking or offer, though both are built while it travels)."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge")})
    other = Orchestrator(nats_url, name="other")
    await other.start()
    nc = await nats.connect(nats_url)
    offers: list[str] = []

    async def on_offer(msg: Any) -> None:
        offers.append(msg.subject)

    try:
        await nc.subscribe(subjects.offers("*"), cb=on_offer)
        await nc.subscribe(subjects.offer("*"), cb=on_offer)
        await settle(nc)
        same = spec("dup", [sleep_task("x", 0.01), sleep_task("y", 0.01, deps=["x"])])
        first = await orch.submit_spec(same, "dup-1")
        await orch.wait_terminal("dup-1", 10)
        await settle(nc)
        offered = len(offers)
        assert offered >= 1
        again = await other.submit_spec(same, "dup-1")
        assert again.pipeline_id == "dup-1" and again.plan == first.plan
        await settle(nc)
        assert len(offers) == offered  # the second replica offered nothing
        assert other.store.stats.writes == 0  # and booked nothing
        assert "dup-1" not in other.pipelines
    finally:
        await nc.close()
        await other.stop()
        await stop_cluster(orch, agents)


async def test_the_gc_pause_logger_comes_and_goes_with_the_orchestrator(nats_url: str) -> None:
    import gc
    import logging

    timing = logging.getLogger("mars.timing")
    level = timing.level
    timing.setLevel(logging.DEBUG)
    before = list(gc.callbacks)
    orch = Orchestrator(nats_url, name="gc")
    try:
        await orch.start()
        added = [cb for cb in gc.callbacks if cb not in before]
        assert len(added) == 1 and added[0] is orch._gc_hook
    finally:
        await orch.stop()
        timing.setLevel(level)
    assert gc.callbacks == before  # a second orchestrator in this process adds its own only


async def test_a_task_replanned_right_after_a_held_tiny_one_does_not_lose_to_its_window(
    nats_url: str, tmp_path: Path
) -> None:
    """A task planned shorter than the shortest reservation (`MIN_WINDOW_S`) holds its slot a
    little past its planned end. When another task of its pipeline is re-planned (here: after
    a rejection) onto that slot right after it, the plan must not start it inside that
    reservation: each round would lose to the pipeline's own window, up to MAX_ROUNDS."""
    one_slot = {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": 10.0, "emulated": True}
    orch, agents = await start_cluster(nats_url, fast_rejects(tmp_path, one_slot))
    here = {"pinned_agent": "slow-has-model"}
    try:
        s = spec("tiny", [
            sleep_task("a", 0.05, requires=here),
            sleep_task("t", 0.0002, deps=["a"], requires=here),  # ends 0.2 ms after a
            ONLY_ON_SLOW,
        ])  # fmt: skip
        reply = await orch.submit_spec(s, "tiny-1")
        assert {p.task_id: p.agent_id for p in reply.plan}["m"] == "slow-has-model"
        run = await orch.wait_terminal("tiny-1", 20)
        assert run.state == "succeeded", run.reason
        assert run.rejections == 1 and run.conflicts == 0, run.placement_log
    finally:
        await stop_cluster(orch, agents)


async def test_a_pipeline_not_placed_after_its_rounds_is_logged_with_its_reasons(
    nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The submitter gets the error; the operator's log gets a warning saying why, per task
    and device (here: one round allowed, and the one agent the plan chose rejects)."""
    monkeypatch.setattr("orchestrator.placement.placer.MAX_ROUNDS", 1)
    orch, agents = await start_cluster(nats_url, fast_rejects(tmp_path))
    try:
        s = spec("once", [ONLY_ON_SLOW])
        with (
            caplog.at_level(logging.WARNING, logger="mars.orchestrator"),
            pytest.raises(ServiceError) as err,
        ):
            await orch.submit_spec(s, "once-1")
        assert err.value.code == "conflict"
        lines = [r.getMessage() for r in caplog.records if r.name == "mars.orchestrator"]
        assert any(
            "pipeline once-1 not placed: no placement after 1 rounds" in m
            and "m@fast-no-model:gpu0: missing_model" in m
            for m in lines
        ), lines
    finally:
        await stop_cluster(orch, agents)
