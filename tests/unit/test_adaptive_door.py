"""Adaptive re-scheduling driven through its door by a stand-in service (tests/unit/doors.py):
a late task priced with the real planner's cost model, and a move carried out through the
placer port (which binds tasks through the state machine). No NATS, no timers: the lateness
is the trigger the lateness timer would build, and the clock is the stand-in's.

The pipeline: a then b, 1 s each, both on x (one slot); y, as fast, is idle."""

from __future__ import annotations

import asyncio

from orchestrator.ports import AdaptiveDoor
from orchestrator.reliability.adaptive import Adaptive, Trigger
from orchestrator.scheduling import Placement
from orchestrator.state import lifecycle as lc
from orchestrator.state.pipelines import PipelineRun
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import decode
from schemas.events import TaskEvent
from schemas.pipeline import PipelineSpec
from tests.unit.doors import AdaptiveService, Cancelled, advert, turns

PID = "p1"
START = 1000.0
X = "dev.x.cpu0"


def started(task: str, token: int) -> TaskEvent:
    return TaskEvent.model_validate(dict(
        event_id=f"s-{task}", pipeline_id=PID, task_id=task, agent_id="x", incarnation="i1",
        device_id="cpu0", token=token, state="started", duration_s=0.0,
    ))  # fmt: skip


async def service(tasks: list[str]) -> tuple[AdaptiveService, Adaptive, PipelineRun]:
    """`tasks` in a chain on x, 1 s each, committed at START with their windows booked;
    the first started at once."""
    svc = AdaptiveService(now=START, devices=["x:cpu0", "y:cpu0"])
    for agent in ("x", "y"):
        svc.view.on_advert(advert(agent), START)
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": t, "run": {"kind": "synthetic", "seconds": 1.0}, "deps": tasks[:i][-1:]}
        for i, t in enumerate(tasks)
    ]})  # fmt: skip
    run = PipelineRun(PID, spec, START)
    run.t0 = wall = svc.wall()
    placements = {t: Placement(t, "x:cpu0", 0, float(i), i + 1.0) for i, t in enumerate(tasks)}
    bound = {t: lc.BoundTask("x", "cpu0", 7, 1.0, None) for t in tasks}
    lc.step(run, lc.Placing(), START)
    lc.step(run, lc.Bound(placements, [], "heft", bound), START)
    windows = [
        BookingWindow(
            pipeline_id=PID, task_id=t, slot=0, start=wall + p.start, end=wall + p.finish,
            expires=wall + 30.0, owner="orch-1", submitted=wall,
        )
        for t, p in placements.items()
    ]  # fmt: skip
    assert (await svc.store.book(X, windows, wall)).ok
    lc.step(run, lc.Committed(), START)
    lc.step(run, lc.Heard(started(tasks[0], 7)), START)
    svc.pipelines[PID] = run
    door: AdaptiveDoor = svc  # mypy: the stand-in opens adaptive's door
    return svc, Adaptive(door), run


def late(task: str, elapsed: float) -> Trigger:
    """What the lateness timer hands over for `task`, run `elapsed` s of a 1 s prediction."""
    return Trigger("late", f"{task}@x:cpu0", {"x:cpu0": elapsed / 1.0}, late_task=task)


def on_x(svc: AdaptiveService) -> list[str]:
    entry = svc.kv.entries[X]
    assert entry.value is not None
    return sorted(w.task_id for w in decode(entry.value, DeviceBookings).windows)


async def test_a_late_task_on_the_critical_path_has_what_it_feeds_moved() -> None:
    """a has run 3 s of 1: x is taken to be that much slower, so b, waiting behind it there,
    ends sooner on y. The move pays (its gain over twice its cost) and is made through the
    placer: b alone, kept off every device but y; bound there anew, withdrawn from x, its
    window on x given back, committed, its producer told, and the pipeline recorded."""
    svc, adaptive, run = await service(["a", "b"])
    svc.now = START + 3.0
    d = await adaptive.consider(run, late("a", 3.0))
    assert d is not None and d.replan and d.moved == ("b",) and d.gain_s > 2 * d.cost_s
    [ask] = svc.placer.asked
    assert (ask.only, ask.exclude) == (frozenset("b"), frozenset({("b", "x:cpu0")}))
    assert ask.found == {"b": ("accepted", "x", 7)}
    tr = run.tasks["b"]
    assert (tr.state, tr.agent_id, tr.token) == ("accepted", "y", 101)
    assert run.placements["b"].device_id == "y:cpu0" and run.tasks["a"].agent_id == "x"
    assert svc.cancelled == [
        Cancelled(PID, {"b": "x:cpu0"}, "moved by adaptive re-scheduling", None)
    ]
    assert on_x(svc) == ["a"]
    assert svc.commits.committed == [(PID, {"b"}, False, True)]
    assert [set(moved) for _, moved in svc.displaced.rerouted] == [{"b"}]
    assert svc.persisted == [PID] and svc.woken == 1
    assert run.placement_log[-1] == "adaptive: moved b" and d.line() in run.placement_log
    assert adaptive.decisions == [d]


async def test_a_move_that_costs_more_than_it_gains_is_not_made() -> None:
    """a, alone, has run 3 s of 1 on x: restarting it on y would throw 3 s away to gain 1.
    The plan is kept, said in the pipeline's log, and nothing is placed or withdrawn."""
    svc, adaptive, run = await service(["a"])
    svc.now = START + 3.0
    d = await adaptive.consider(run, late("a", 3.0))
    assert d is not None and not d.replan and d.cost_s > d.gain_s / 2
    assert "decision=keep" in d.line() and run.placement_log[-1] == d.line()
    assert svc.placer.asked == [] and svc.cancelled == [] and svc.commits.committed == []
    assert on_x(svc) == ["a"] and run.tasks["a"].agent_id == "x"
    assert svc.persisted == []


async def test_no_move_while_another_re_placement_of_the_pipeline_runs() -> None:
    """A re-placement of the pipeline under way (recovery's lock held) is left alone: the
    move is not made, and the log says why."""
    svc, adaptive, run = await service(["a", "b"])
    svc.now = START + 3.0
    lock = svc.recovery.lock(PID)
    await lock.acquire()
    try:
        pricing = asyncio.ensure_future(adaptive.consider(run, late("a", 3.0)))
        await turns(50)
        assert pricing.done()  # it did not wait for the lock
    finally:
        lock.release()
    d = await pricing
    assert d is not None and d.replan
    assert svc.placer.asked == [] and svc.cancelled == [] and run.tasks["b"].agent_id == "x"
    assert run.placement_log[-1] == (
        "adaptive: not moved: another re-placement of the pipeline is under way"
    )
