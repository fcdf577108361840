"""Adaptive re-scheduling's pure parts: the gain rule, the triggers' thresholds, re-timing and
the what-if decision on hand-made situations."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.reliability.adaptive import (
    GAIN_FACTOR,
    Situation,
    decide,
    is_late,
    retime,
    speed_dropped,
    worth_moving,
)
from orchestrator.scheduling import Cluster, Device, Link, LinkCostModel, Placement, Task, TaskGraph
from orchestrator.scheduling import heft as heft_plan

secs = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(gain=st.floats(allow_nan=True, allow_infinity=True), cost=secs)
def test_rule_is_gain_over_twice_the_cost(gain: float, cost: float) -> None:
    expect = math.isfinite(gain) and gain > GAIN_FACTOR * cost
    assert worth_moving(gain, cost) is expect


@given(gain=secs, cost=secs, more=st.floats(min_value=0.0, max_value=1e6))
def test_rule_is_monotone(gain: float, cost: float, more: float) -> None:
    if worth_moving(gain, cost):
        assert worth_moving(gain + more, cost)  # more gain never turns a yes into a no
        assert worth_moving(gain, max(0.0, cost - more))  # nor does a cheaper move


@given(cost=secs, gain=st.floats(max_value=0.0, allow_nan=False))
def test_no_gain_never_moves(cost: float, gain: float) -> None:
    assert not worth_moving(gain, cost)


def test_thresholds() -> None:
    assert not is_late(1.29, 1.0) and is_late(1.31, 1.0)
    assert not is_late(5.0, 0.0)  # nothing predicted: nothing to be late against
    assert speed_dropped(100.0, 85.0) and not speed_dropped(100.0, 86.0)
    assert not speed_dropped(100.0, 120.0)


# -- what-if ---------------------------------------------------------------------------------------
FAST = Link(latency_s=0.001, bandwidth_Bps=1e9)
SLOW = Link(latency_s=0.1, bandwidth_Bps=1e6)


def world(
    input_bytes: float, link: Link, ids: str = "abc"
) -> tuple[TaskGraph, Cluster, LinkCostModel, dict[str, Placement]]:
    """A chain (a -> b -> c), each 1 s of work, planned on the faster device `x:d` at site A;
    `y:d` at site B is a little slower. `a`'s output (`input_bytes`) feeds `b`."""
    graph = TaskGraph(
        [Task(t, 1.0) for t in ids],
        {(s, d): input_bytes if s == "a" else 0.0 for s, d in itertools.pairwise(ids)},
    )
    cluster = Cluster([Device("x:d", "x", "A", speed=1.0), Device("y:d", "y", "B", speed=0.8)])
    cost = LinkCostModel({("A", "B"): link})
    plan = heft_plan(graph, cluster, cost)
    assert {p.device_id for p in plan.placements.values()} == {"x:d"}
    return graph, cluster, cost, dict(plan.placements)


def after_a(
    slower: float, input_bytes: float, link: Link, pinned: frozenset[str], ids: str = "abc"
) -> Situation:
    """`a` finished at 1.0; now is 1.0 and device x just got `slower` times slower."""
    graph, cluster, cost, plan = world(input_bytes, link, ids)
    return Situation(
        graph, cluster, cost, plan, {"a": plan["a"]}, {}, {}, 1.0,
        slower={"x:d": slower}, pinned=pinned,
    )  # fmt: skip


def test_retime_of_a_plan_under_its_own_costs_keeps_its_times() -> None:
    graph, cluster, cost, plan = world(1000.0, FAST)
    again = retime(graph, cluster, cost, plan, {}, 0.0)
    for t, p in plan.items():
        assert math.isclose(again[t].finish, p.finish) and again[t].device_id == p.device_id


def test_a_much_slower_device_with_a_cheap_move_replans() -> None:
    d = decide("p", "drift", after_a(5.0, 1000.0, FAST, frozenset()))
    assert d.replan and set(d.moved) == {"b", "c"}
    assert d.gain_s > GAIN_FACTOR * d.cost_s > 0.0
    assert math.isclose(d.makespan_keep_s, 11.0)  # b and c at 5 s each after a
    assert "decision=replan" in d.line() and f"gain_s={d.gain_s:.3f}" in d.line()


def test_an_expensive_input_move_keeps_the_plan_unless_the_gain_covers_it() -> None:
    # moving b saves time, but shipping a's 2 MB output over 1 MB/s (2.1 s) costs more
    d = decide("p", "drift", after_a(5.0, 2e6, SLOW, frozenset(), "ab"))
    assert d.moved == ("b",) and not d.replan
    assert 0.0 < d.gain_s <= GAIN_FACTOR * d.cost_s
    assert math.isclose(d.cost_s, 2.1 + 0.02)
    assert "decision=keep" in d.line()
    # ten times slower: the same move now pays for itself twice over
    d = decide("p", "drift", after_a(10.0, 2e6, SLOW, frozenset(), "ab"))
    assert d.moved == ("b",) and d.replan


def test_a_small_slowdown_moves_nothing() -> None:
    d = decide("p", "drift", after_a(1.1, 1000.0, FAST, frozenset()))
    assert not d.replan and d.moved == ()


def test_non_migratable_tasks_never_move() -> None:
    d = decide("p", "drift", after_a(5.0, 1000.0, FAST, frozenset({"b", "c"})))
    assert not d.replan and d.moved == ()
    d = decide("p", "drift", after_a(5.0, 1000.0, FAST, frozenset({"b"})))
    assert "b" not in d.moved


def test_a_running_task_may_restart_elsewhere_paying_its_progress() -> None:
    graph, cluster, cost, plan = world(1000.0, FAST)
    # b runs since 1.0 on x, now 1.5; x got 20x slower: b would need 19 more seconds there
    s = Situation(
        graph, cluster, cost, plan, {"a": plan["a"]},
        {"b": Placement("b", "x:d", 0, 1.0, 1.0 + 20.0)}, {"b": 0.5}, 1.5,
        slower={"x:d": 20.0}, restartable=frozenset({"b"}),
    )  # fmt: skip
    d = decide("p", "drift", s)
    assert d.replan and "b" in d.moved
    assert d.cost_s >= 0.5  # the half second b had run is lost


class _Orch:
    """What `Adaptive._late` reads of an orchestrator: its pipelines, its clock, its spawner."""

    def __init__(self) -> None:
        from orchestrator.state.pipelines import PipelineRun

        self.pipelines: dict[str, PipelineRun] = {}
        self.now = 100.0
        self.priced: list[str] = []

    def mono(self) -> float:
        return self.now

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        coro.close()


async def test_late_tasks_of_one_pipeline_are_priced_once_per_gap() -> None:
    """Two tasks of one pipeline late together: one pricing now, the other when the gap
    ends (if it is still running then); another pipeline is not held back."""
    from orchestrator.reliability.adaptive import LATE_GAP_S, Adaptive, Trigger
    from orchestrator.state.pipelines import PipelineRun
    from schemas import PipelineSpec

    orch = _Orch()
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": t, "run": {"kind": "synthetic", "seconds": 0.001}} for t in ("a", "b")
    ]})  # fmt: skip
    for pid in ("p1", "p2"):
        run = PipelineRun(pid, spec, 0.0)
        run.committed_at = 0.0
        for tr in run.tasks.values():
            tr.state, tr.token, tr.started_s, tr.predicted_s = "started", 1, 0.0, 0.001
            tr.agent_id, tr.device_id = "x", "cpu0"
        orch.pipelines[pid] = run
    ad = Adaptive(orch)  # type: ignore[arg-type]

    def pricing(run: PipelineRun, trig: Trigger) -> Coroutine[Any, Any, None]:
        orch.priced.append(f"{run.pipeline_id}/{trig.late_task}")
        return asyncio.sleep(0)

    ad.consider = pricing  # type: ignore[method-assign]
    ad._late(("p1", "a", 1))
    ad._late(("p1", "b", 1))
    ad._late(("p2", "a", 1))
    assert orch.priced == ["p1/a", "p2/a"]  # p1's b waits; p2 is not held back by p1
    held = ad._timers[("p1", "b", 1)]
    assert held.when() - asyncio.get_running_loop().time() <= LATE_GAP_S + 1e-3
    held.cancel()
    orch.now += LATE_GAP_S
    ad._late(("p1", "b", 1))
    assert orch.priced == ["p1/a", "p2/a", "p1/b"]
    ad.stop()


def test_a_task_whose_consumer_started_is_not_restarted() -> None:
    """Events arrive in any order: c is reported started while b, its producer, still looks
    running. b has finished in fact; pricing must not try to restart it (that left c fixed on
    an input that was not, and the whole decision failed)."""
    graph, cluster, cost, plan = world(1000.0, FAST)
    s = Situation(
        graph, cluster, cost, plan, {"a": plan["a"]},
        {"b": Placement("b", "x:d", 0, 1.0, 21.0), "c": Placement("c", "x:d", 0, 1.4, 2.4)},
        {"b": 0.5, "c": 0.1}, 1.5, slower={"x:d": 20.0}, restartable=frozenset({"b"}),
    )  # fmt: skip
    d = decide("p", "late", s)
    assert "b" not in d.moved


def test_remaining_work_below_the_cheapest_move_is_not_priced() -> None:
    """Five times slower is worth a move when a second of work is left (above), but not when
    the whole pipeline has 10 ms left: no move can save more than that, and one costs 20 ms."""
    graph = TaskGraph([Task(t, 0.003) for t in "abc"], {("a", "b"): 1000.0, ("b", "c"): 0.0})
    cluster = Cluster([Device("x:d", "x", "A", speed=1.0), Device("y:d", "y", "B", speed=0.8)])
    cost = LinkCostModel({("A", "B"): FAST})
    plan = dict(heft_plan(graph, cluster, cost).placements)
    tiny = Situation(
        graph, cluster, cost, plan, {"a": plan["a"]}, {}, {}, plan["a"].finish,
        slower={"x:d": 5.0},
    )  # fmt: skip
    d = decide("p", "drift", tiny)
    assert not d.replan and d.moved == () and "not priced" in d.why
    assert math.isclose(d.makespan_keep_s - tiny.now, 0.03)  # b and c, 15 ms each on x now
    big = decide("p", "drift", after_a(5.0, 1000.0, FAST, frozenset()))
    assert big.replan and "not priced" not in big.why


@given(
    works=st.lists(st.floats(min_value=1e-4, max_value=0.1), min_size=2, max_size=5),
    speeds=st.lists(st.floats(min_value=0.2, max_value=5.0), min_size=2, max_size=3),
    slower=st.floats(min_value=1.0, max_value=50.0),
    done=st.integers(min_value=0, max_value=4),
    late=st.floats(min_value=0.0, max_value=0.05),
    slow_link=st.booleans(),
)
def test_a_situation_the_bound_skips_is_never_worth_a_move(
    works: list[float], speeds: list[float], slower: float, done: int, late: float, slow_link: bool
) -> None:
    """Skipping the pricing changes no decision: whenever `cannot_pay` holds, the full
    evaluation (re-plan, and restart of what runs) finds nothing worth moving either."""
    from orchestrator.reliability.adaptive import cannot_pay, evaluate, keep_makespan, most_to_gain

    ids = [f"t{i}" for i in range(len(works))]
    graph = TaskGraph(
        [Task(t, w) for t, w in zip(ids, works, strict=True)],
        {(s, d): 1e5 for s, d in itertools.pairwise(ids)},
    )
    devs = [Device(f"n{i}:d", f"n{i}", "AB"[i % 2], speed=v) for i, v in enumerate(speeds)]
    cluster = Cluster(devs)
    cost = LinkCostModel({("A", "B"): SLOW if slow_link else FAST})
    plan = dict(heft_plan(graph, cluster, cost).placements)
    k = min(done, len(ids) - 1)
    finished = {t: plan[t] for t in ids[:k]}
    now = (plan[ids[k - 1]].finish if k else 0.0) + late
    run_id = ids[k]
    running = {run_id: Placement(run_id, plan[run_id].device_id, 0, now, now + works[k])}
    s = Situation(
        graph, cluster, cost, plan, finished, running, {run_id: late / 2}, now,
        slower={plan[run_id].device_id: slower}, restartable=frozenset({run_id}),
    )  # fmt: skip
    keep = keep_makespan(s)
    if cannot_pay(s, keep):
        opt = evaluate(s)
        assert not opt.moved or not worth_moving(opt.gain_s, opt.cost_s)
        assert opt.gain_s <= most_to_gain(s, keep) + 1e-9
        assert not decide("p", "drift", s).replan


async def test_a_start_reported_into_the_run_shortens_its_lateness_timer() -> None:
    """Starts are reported `started_event_after_s` into a run, saying how long it had run:
    the lateness timer counts that time, not only what follows the event."""
    from orchestrator.reliability.adaptive import Adaptive
    from orchestrator.state.pipelines import PipelineRun
    from schemas import PipelineSpec, TaskEvent

    orch = _Orch()
    spec = PipelineSpec.model_validate(
        {"name": "p", "tasks": [{"id": "a", "run": {"kind": "synthetic", "seconds": 1.0}}]}
    )
    run = PipelineRun("p1", spec, 0.0)
    tr = run.tasks["a"]
    tr.state, tr.token, tr.predicted_s, tr.agent_id, tr.device_id = "accepted", 1, 1.0, "x", "c"
    orch.pipelines["p1"] = run
    ad = Adaptive(orch)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    timers: dict[float, asyncio.TimerHandle] = {}
    for ran in (0.0, 0.4):
        ev = TaskEvent(
            event_id=f"e{int(ran * 10)}", pipeline_id="p1", task_id="a", agent_id="x",
            incarnation="i", device_id="c", token=1, state="started", duration_s=ran,
        )  # fmt: skip
        ad.task_event(ev)
        timers[ran] = ad._timers.pop(("p1", "a", 1))
        timers[ran].cancel()
    due = ad._due(1.0)
    assert timers[0.0].when() - loop.time() == pytest.approx(due, abs=0.05)
    assert timers[0.4].when() - loop.time() == pytest.approx(due - 0.4, abs=0.05)
    ad.stop()
