"""Simulator comparisons: the same random draws for every policy, intervals over seeds, a
kube-scheduler-like baseline that scores the share of nodes its defaults do, and planning
times measured after a warm-up plan."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from orchestrator.scheduling import (
    Cluster,
    CostModel,
    Device,
    LinkCostModel,
    Placement,
    Plan,
    Task,
    TaskGraph,
    heft,
)
from sim import run as sim_run
from sim.des import FAIL_PICK, SimConfig, SimResult, Simulator
from sim.des_events import Failure, poisson_arrivals
from sim.policies import KubeLike, Occupancy, make_policy, nodes_to_score
from sim.report import T975, ci95
from sim.workloads import random_dag, tiered_cluster

WAN = 35e6 / 8
CLUSTER, LINKS = tiered_cluster(24, seed=3)
COST = LinkCostModel(LINKS)


def _noise_factors(r: SimResult) -> dict[tuple[int, str], float]:
    """(pipeline, task) -> actual / planned duration of its (only) attempt."""
    out = {}
    devices = {d.id: d for d in CLUSTER.devices}
    for e in r.executions:
        graph = _GRAPHS[e.pipeline]  # Poisson arrivals keep the order of the graphs
        task = graph.tasks[graph.index[e.task_id]]
        planned = COST.compute_time(task, devices[e.device_id])
        if planned > 0:
            out[(e.pipeline, e.task_id)] = (e.finish - e.start) / planned
    return out


_GRAPHS = [random_dag(20, ccr=1.0, seed=s, bandwidth_Bps=WAN) for s in range(10)]


def test_every_policy_gets_the_same_task_noise_whatever_its_placement() -> None:
    arrivals = poisson_arrivals(_GRAPHS, 0.2, seed=4)
    cfg = SimConfig(noise_sigma=0.4, seed=11)
    factors = {}
    for name in ("portfolio", "least-loaded", "round-robin"):
        r = Simulator(CLUSTER, COST, make_policy(name), arrivals, config=cfg).run()
        assert all(not e.killed for e in r.executions)
        factors[name] = _noise_factors(r)
    a, b, c = factors.values()
    assert len(a) == sum(len(g) for g in _GRAPHS)
    assert a.keys() == b.keys() == c.keys()
    for key, f in a.items():
        assert b[key] == pytest.approx(f, rel=1e-9) and c[key] == pytest.approx(f, rel=1e-9)
    assert len({round(f, 6) for f in a.values()}) > 100  # real noise, not a constant


def test_every_policy_gets_the_same_failure_instants_detection_delays_and_arrivals() -> None:
    arrivals = poisson_arrivals(_GRAPHS, 0.5, seed=4)
    end = arrivals[-1].at
    failures = [Failure(end * k / 4) for k in (1, 2, 3)]
    cfg = SimConfig(noise_sigma=0.3, seed=5)
    seen = []
    for name in ("portfolio", "heft", "least-loaded", "kube-like"):
        r = Simulator(
            CLUSTER, COST, make_policy(name), arrivals, failures=failures, config=cfg
        ).run()
        seen.append(
            (
                [p.arrival for p in r.pipelines],
                [f.at for f in r.failures],
                [f.detection_s for f in r.failures],
            )
        )
    assert all(s == seen[0] for s in seen[1:])
    assert len(seen[0][1]) == 3 and len(set(seen[0][2])) == 3


def test_an_unnamed_failure_hits_the_same_node_when_it_is_busy_under_both_policies() -> None:
    devs = [Device(f"d{j}", f"a{j}", "s") for j in range(6)]
    cluster = Cluster(devs)
    wide = TaskGraph([Task(f"t{k}", work=10.0) for k in range(6)], {})
    hit = set()
    for name in ("round-robin", "least-loaded", "heft"):
        arrivals = poisson_arrivals([wide], 1.0, seed=0)
        r = Simulator(
            cluster,
            LinkCostModel(),
            make_policy(name),
            arrivals,
            failures=[Failure(1.0)],
            config=SimConfig(noise_sigma=0.2, seed=3),
        ).run()
        hit.add(r.failures[0].devices)
    # Every device is busy under each policy: the first one of the event's random order dies.
    first = int(np.random.default_rng([3, FAIL_PICK, 0]).permutation(6)[0])
    assert hit == {(f"d{first}",)}


def test_ci95_matches_a_hand_computed_interval() -> None:
    # values 1, 2, 3, 4: mean 2.5, sample sd sqrt(5/3), t(0.975, 3) = 3.182
    iv = ci95([1.0, 2.0, 3.0, 4.0])
    assert iv.mean == 2.5 and iv.n == 4
    assert iv.half == pytest.approx(3.182 * math.sqrt(5 / 3) / 2, rel=1e-12)
    assert iv.half == pytest.approx(2.05397, abs=1e-5)
    assert ci95([2.0, 2.0]).half == 0.0
    one = ci95([7.0, math.nan])
    assert (one.mean, one.n) == (7.0, 1) and math.isnan(one.half)
    assert ci95([]).n == 0 and ci95([]).cell() == "-"
    assert ci95([1.0, 3.0]).cell() == "2.000 ± 12.7"  # 12.706 x sqrt(2) / sqrt(2)


def test_t_table_is_students() -> None:
    stats = pytest.importorskip("scipy.stats")
    for df, t in enumerate(T975, start=1):
        assert t == pytest.approx(float(stats.t.ppf(0.975, df)), abs=6e-4)


def test_nodes_to_score_follows_kube_schedulers_default() -> None:
    # every node below 100; else 50 - nodes/125 percent (at least 5), at least 100 nodes
    assert nodes_to_score(40) == 40
    assert nodes_to_score(100) == 100
    assert nodes_to_score(140) == 100
    assert nodes_to_score(300) == 144
    assert nodes_to_score(1000) == 420
    assert nodes_to_score(5000) == 500
    assert nodes_to_score(10_000) == 500
    assert nodes_to_score(100_000) == 5000
    assert nodes_to_score(1000, percentage=30) == 300
    assert nodes_to_score(1000, percentage=100) == 1000


def test_kube_like_filters_then_scores_only_its_share_from_a_rotating_start() -> None:
    # 300 devices, the even ones CPUs, the odd ones GPUs; a CPU-only task is feasible on 150.
    devs = [Device(f"d{j}", f"a{j}", "s", kind="cpu" if j % 2 == 0 else "gpu") for j in range(300)]
    cluster = Cluster(devs)
    graph = TaskGraph(
        [Task("x", kinds=frozenset({"cpu"})), Task("y", kinds=frozenset({"cpu"}))], {}
    )
    load = np.ones(300)
    load[100] = 0.5  # the least booked device among the first 144 feasible ones
    load[298] = 0.0  # idle, but beyond them: not scored
    occ = Occupancy(0.0, load, np.zeros(300))
    policy = KubeLike(scored=[])
    plan = policy.plan(graph, cluster, LinkCostModel(), fixed={}, now=0.0, occ=occ)
    # x: 144 feasible found at d0..d286 (287 looked at); y: from d287 on, wrapping around.
    assert policy.scored == [144, 144]
    assert plan.placements["x"].device_id == "d100"
    assert plan.placements["y"].device_id == "d298"
    # y looked at d287..d299 (13) and d0..d274 (275): the next task starts at d275.
    assert policy.start == (287 + 13 + 275) % 300 == 275
    ll = make_policy("least-loaded").plan(
        graph, cluster, LinkCostModel(), fixed={}, now=0.0, occ=occ
    )
    assert ll.placements["x"].device_id == "d298"


@dataclass
class _SlowFirstCall:
    """HEFT whose first call in the process costs 0.3 s more (as a JIT would: the cost is
    per process, so it is kept on the class, not on the instance the warm-up copies)."""

    calls: ClassVar[list[float]] = []
    name: str = "slow-first"

    def plan(
        self,
        graph: TaskGraph,
        cluster: Cluster,
        cost: CostModel,
        *,
        fixed: Mapping[str, Placement],
        now: float,
        occ: Occupancy,
    ) -> Plan:
        if not self.calls:
            time.sleep(0.3)
        self.calls.append(now)
        return heft(graph, cluster, cost, fixed=fixed, now=now)


def test_planning_times_are_taken_after_an_untimed_warm_up_plan() -> None:
    arrivals = poisson_arrivals(_GRAPHS[:3], 1.0, seed=1)
    _SlowFirstCall.calls.clear()
    r = Simulator(CLUSTER, COST, _SlowFirstCall(), arrivals).run()
    assert len(_SlowFirstCall.calls) == 4  # the warm-up, then one per arrival
    assert len(r.plan_wall_s) == 3 and max(r.plan_wall_s) < 0.25
    assert r.warmup_wall_s >= 0.3
    _SlowFirstCall.calls.clear()
    cold = Simulator(
        CLUSTER, COST, _SlowFirstCall(), arrivals, config=SimConfig(warmup=False)
    ).run()
    assert cold.plan_wall_s[0] >= 0.3 and math.isnan(cold.warmup_wall_s)


def test_warm_up_leaves_a_stateful_policy_where_it_was() -> None:
    arrivals = poisson_arrivals(_GRAPHS[:4], 0.5, seed=2)
    got = [
        Simulator(CLUSTER, COST, make_policy(name), arrivals, config=SimConfig(warmup=warm)).run()
        for name in ("round-robin", "weighted-random", "kube-like")
        for warm in (True, False)
    ]
    for warm, cold in zip(got[::2], got[1::2], strict=True):
        assert warm.plans == cold.plans


def test_the_table_lists_seeds_and_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ec"
    argv = ["edge-cloud", "--quick", "--seed", "4", "--seeds", "2", "--no-plots"]
    assert sim_run.main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "over 2 seed(s) (4-5)" in text and "after one untimed warm-up plan" in text
    doc = json.loads((out / "result.json").read_text())
    assert doc["seeds"] == [4, 5]
    for policy in ("portfolio", "heft", "kube-like", "least-loaded", "round-robin"):
        row = next(line for line in text.splitlines() if line.startswith(policy + " "))
        assert row.count(" ± ") == 7, row  # every metric but recovery (no failures here)
        assert "heartbeat" not in row  # ... and no detection model: none plays a part
        resp = [doc["per_seed"][s][policy]["response_s"]["mean"] for s in ("4", "5")]
        got = doc["summary"][policy]["resp mean s"]
        assert got["n"] == 2 and got["mean"] == pytest.approx(sum(resp) / 2)
        assert got["ci95_half"] == pytest.approx(12.706 * abs(resp[0] - resp[1]) / 2)
