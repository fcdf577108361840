"""The portfolio's admission follows this process's measured loop speed, fixed once per
process, so that one graph and one budget give one plan."""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Iterator

import pytest

from orchestrator.scheduling import (
    Cluster,
    Device,
    LinkCostModel,
    Task,
    TaskGraph,
    calibration,
    compiled,
    portfolio,
)
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.portfolio import TIME_CANDIDATES, heft_estimate

from .sched_problems import spy_candidates

portfolio_module = importlib.import_module("orchestrator.scheduling.portfolio")


@pytest.fixture(autouse=True)
def _keep_scale() -> Iterator[None]:
    before = calibration.loop_scale()
    yield
    calibration.set_loop_scale(before)


def _layered(n: int, m: int) -> tuple[TaskGraph, Cluster, LinkCostModel]:
    """n tasks in layers of 10, two out-edges each, on m devices over two sites."""
    tasks = [Task(f"t{i}", work=1.0 + i % 4) for i in range(n)]
    edges = {(f"t{i}", f"t{(i // 10 + 1) * 10 + (i + k) % 10}"): 2e6
             for i in range(n - 10) for k in (0, 3)}  # fmt: skip
    devices = [Device(f"d{j}", f"h{j}", f"s{j % 2}", speed=1.0 + j) for j in range(m)]
    return TaskGraph(tasks, edges), Cluster(devices), LinkCostModel()


def _admitted(unit: float, budget: float, tasks: int = 400) -> list[str]:
    spent, out = unit, []
    for c in TIME_CANDIDATES:
        if spent + unit * c.factor(tasks) <= budget:
            spent += unit * c.factor(tasks)
            out.append(c.name)
    return out


def test_admission_scales_with_the_measured_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    graph, cluster, cost = _layered(400, 16)
    ran = spy_candidates(monkeypatch)
    prep = Prepared(graph, cluster, cost, None, 0.0)
    # a loop as slow as the old fixed constants assumed: at 0.05 s little beyond HEFT fits
    calibration.set_loop_scale(1.0)
    slow = heft_estimate(prep)
    portfolio(graph, cluster, cost)
    assert ran == _admitted(slow, 0.05)
    few = len(ran)
    assert few < len(TIME_CANDIDATES) // 2
    # 64x faster, as the compiled loop measures: the same call runs what fits at that speed
    ran.clear()
    calibration.set_loop_scale(1 / 64)
    assert heft_estimate(prep) == pytest.approx(slow / 64)
    portfolio(graph, cluster, cost)
    assert ran == _admitted(slow / 64, 0.05)
    assert len(ran) > few
    # fast enough for everything
    ran.clear()
    calibration.set_loop_scale(2.0**-16)
    plan = portfolio(graph, cluster, cost)
    assert ran == [c.name for c in TIME_CANDIDATES]
    again = portfolio(graph, cluster, cost)
    assert again.placements == plan.placements  # the same graph, the same plan
    with pytest.raises(ValueError, match="scale"):
        calibration.set_loop_scale(0.0)


def test_loop_is_measured_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def measure() -> float:
        calls.append(1)
        return 0.0123  # log2 -6.35: rounds to 2**-6.25 (quarter powers of two)

    monkeypatch.setattr(calibration, "measure", measure)
    calibration.set_loop_scale(None)
    graph, cluster, cost = _layered(40, 4)
    portfolio(graph, cluster, cost)
    portfolio(graph, cluster, cost)
    assert calls == [1]
    assert calibration.loop_scale() == 2.0**-6.25


def test_the_loop_is_timed_in_cpu_time_not_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neighbours competing for the cores stretch wall time, not this thread's CPU time: a
    wall clock that leaps a second between reads must not change the measurement."""
    wall = iter(range(0, 10_000, 1))
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(wall)))
    measured = calibration.measure()
    assert 0 < measured < 1.0  # a second per call would read as ~40x the formula


def test_clusters_beyond_the_dense_loops_are_estimated_on_their_own_scale() -> None:
    """The general path costs several times more per task than the dense loops: a single
    scale estimated 1,000 x 1,000 HEFT at 1.3 ms where it ran 49 ms."""
    calibration.set_loop_scale(1 / 128, wide=1 / 8)
    small = Prepared(*_layered(200, 16), None, 0.0)
    wide = Prepared(*_layered(200, 300), None, 0.0)
    assert not calibration.is_wide(200, 16, small.cluster.n_slots)
    assert calibration.is_wide(200, 300, wide.cluster.n_slots)
    e_small, e_wide = len(small.graph.edges), len(wide.graph.edges)
    assert heft_estimate(small) == pytest.approx(calibration.formula(200, e_small, 16) / 128)
    assert heft_estimate(wide) == pytest.approx(calibration.wide_formula(200, e_wide, 300) / 8)
    # the wide formula grows faster than linearly in the task count
    assert calibration.wide_formula(400, 0, 300) > 2 * calibration.wide_formula(200, 0, 300)


def test_the_wide_scale_is_measured_once_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def measure_wide() -> float:
        calls.append(1)
        return 0.15

    monkeypatch.setattr(calibration, "measure_wide", measure_wide)
    calibration.set_loop_scale(1 / 128)  # the wide one: measured again on next use
    graph, cluster, cost = _layered(40, 300)
    portfolio(graph, cluster, cost)
    portfolio(graph, cluster, cost)
    assert calls == [1]
    assert calibration.wide_scale() == pytest.approx(2.0 ** (round(4 * math.log2(0.15)) / 4))
    graph, cluster, cost = _layered(40, 4)
    portfolio(graph, cluster, cost)  # dense: no wide measure needed
    assert calls == [1]


def test_measure_times_heft_on_the_fixed_problem() -> None:
    prep = calibration.calibration_problem()
    assert (len(prep.todo), len(prep.cluster)) == (300, 16)
    assert calibration.measure() > 0


def test_candidate_cost_follows_the_loop_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    peft = next(c for c in TIME_CANDIDATES if c.name == "peft")
    monkeypatch.setattr(compiled, "runner", lambda: None)
    assert peft.factor() == peft.weight
    monkeypatch.setattr(compiled, "runner", lambda: object())
    assert peft.factor() == peft.weight_jit


def test_lookahead_cost_grows_faster_than_heft_on_large_graphs() -> None:
    look = next(c for c in TIME_CANDIDATES if c.name == "heft-lookahead")
    base = look.factor(0)
    assert look.factor(portfolio_module.GROWTH_FROM) == base
    assert look.factor(4 * portfolio_module.GROWTH_FROM) == pytest.approx(base * 4**look.growth)
    peft = next(c for c in TIME_CANDIDATES if c.name == "peft")
    assert peft.factor(10_000) == peft.factor(0)  # measured constant at every size
