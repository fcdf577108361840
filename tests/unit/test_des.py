"""The discrete-event simulator: exact against the plan without noise, physical with it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import (
    Cluster,
    Device,
    LinkCostModel,
    Task,
    TaskGraph,
)
from sim.des import SimConfig, Simulator
from sim.des_check import execution_violations
from sim.des_events import Arrival, Failure, Slowdown, poisson_arrivals, trace_arrivals
from sim.detection import HEARTBEAT, KUBERNETES, Detection
from sim.policies import POLICIES, make_policy
from sim.workloads import random_dag, tiered_cluster

WAN = 35e6 / 8
CLUSTER, LINKS = tiered_cluster(24, seed=3)
COST = LinkCostModel(LINKS)


def _graphs(result_pipes: list[Arrival]) -> dict[int, TaskGraph]:
    return {k: a.graph for k, a in enumerate(sorted(result_pipes, key=lambda a: a.at))}


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    v=st.integers(1, 40),
    ccr=st.sampled_from([0.0, 0.5, 2.0]),
    policy=st.sampled_from(POLICIES),
    at=st.sampled_from([0.0, 3.25]),
)
def test_zero_noise_single_pipeline_matches_plan_makespan_exactly(
    seed: int, v: int, ccr: float, policy: str, at: float
) -> None:
    graph = random_dag(v, ccr=ccr, seed=seed, bandwidth_Bps=WAN)
    r = Simulator(CLUSTER, COST, make_policy(policy, seed=seed), [Arrival(at, graph)]).run()
    rec = r.pipelines[0]
    assert rec.completed == r.plans[0].makespan  # exact, not approximately
    r.plans[0].validate(graph, CLUSTER, COST, now=at)
    # Every task ran exactly where and when the plan said.
    for e in r.executions:
        p = r.plans[0].placements[e.task_id]
        assert (e.device_id, e.slot, e.start, e.finish) == (p.device_id, p.slot, p.start, p.finish)


def test_zero_noise_stream_every_pipeline_finishes_as_planned() -> None:
    graphs = [random_dag(25, ccr=1.0, seed=s, bandwidth_Bps=WAN) for s in range(15)]
    arrivals = poisson_arrivals(graphs, 0.2, seed=2)
    for policy in ("portfolio", "least-loaded", "earliest-start"):
        r = Simulator(CLUSTER, COST, make_policy(policy), arrivals).run()
        assert all(p.completed == p.planned_finish for p in r.pipelines), policy
        assert execution_violations(r, _graphs(arrivals), CLUSTER, COST) == []


@pytest.mark.parametrize("policy", POLICIES)
def test_noisy_run_with_incidents_respects_precedence_transfers_and_slots(policy: str) -> None:
    graphs = [random_dag(30, ccr=1.0, seed=s, bandwidth_Bps=WAN) for s in range(12)]
    arrivals = poisson_arrivals(graphs, 0.1, seed=5)
    r = Simulator(
        CLUSTER,
        COST,
        make_policy(policy, seed=1),
        arrivals,
        failures=[Failure(20.0), Failure(60.0, whole_agent=False)],
        slowdowns=[Slowdown(40.0, 0.3)],
        config=SimConfig(noise_sigma=0.4, seed=9),
    ).run()
    assert execution_violations(r, _graphs(arrivals), CLUSTER, COST) == []
    assert all(p.completed is not None for p in r.pipelines)


def _two_devices() -> Cluster:
    return Cluster(
        [
            Device(id="a", agent_id="ha", site="s", speed=2.0),
            Device(id="b", agent_id="hb", site="s", speed=1.0),
        ]
    )


def _chain(n: int, work: float = 4.0) -> TaskGraph:
    tasks = [Task(f"t{k}", work=work) for k in range(n)]
    return TaskGraph(tasks, {(f"t{k}", f"t{k + 1}"): 1e6 for k in range(n - 1)})


def test_failure_replaces_lost_work_on_live_devices_and_pipeline_completes() -> None:
    cluster = _two_devices()
    cost = LinkCostModel()
    graph = _chain(3)
    # HEFT puts the chain on the fast device "a"; it dies while t1 runs there.
    r = Simulator(
        cluster,
        cost,
        make_policy("heft"),
        [Arrival(0.0, graph)],
        failures=[Failure(3.0, device="a")],
        config=SimConfig(detection=Detection("fixed 1 s", timeout_s=1.0), replan_s=0.0),
    ).run()
    assert r.plans[0].placements["t1"].device_id == "a"
    rec = r.pipelines[0]
    assert rec.completed is not None and rec.replans == 1
    killed = [e for e in r.executions if e.killed]
    assert [(e.task_id, e.device_id) for e in killed] == [("t1", "a")]
    after = [e for e in r.executions if not e.killed and e.start >= 3.0]
    assert after and all(e.device_id == "b" for e in after)
    # t0's output lived only on "a", so t0 runs again on "b" before t1 can restart there.
    assert [e.task_id for e in after] == ["t0", "t1", "t2"]
    f = r.failures[0]
    assert f.detected == 4.0 and f.interrupted == 1
    assert f.recovered == after[1].start  # t1 running again
    assert f.recovery_s == 1.0 + 4.0  # detection, then t0 again on "b" (4 s), same device
    assert execution_violations(r, {0: graph}, cluster, cost) == []


def test_slowdown_lengthens_running_and_later_tasks() -> None:
    cluster = Cluster([Device(id="a", agent_id="ha", site="s", speed=1.0)])
    graph = _chain(2, work=4.0)
    base = Simulator(cluster, LinkCostModel(), make_policy("heft"), [Arrival(0.0, graph)]).run()
    slow = Simulator(
        cluster,
        LinkCostModel(),
        make_policy("heft"),
        [Arrival(0.0, graph)],
        slowdowns=[Slowdown(2.0, 0.5, device="a")],
    ).run()
    assert base.pipelines[0].completed == 8.0
    t0, t1 = sorted(slow.executions, key=lambda e: e.start)
    assert t0.finish == 2.0 + 2.0 / 0.5  # half done at the slowdown, the rest at half speed
    assert t1.finish - t1.start == 4.0 / 0.5
    assert slow.slowdowns[0].running == 1


def test_detection_models_span_their_stated_ranges() -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    hb = [HEARTBEAT.sample(rng) for _ in range(500)]
    assert min(hb) >= 1.0 and max(hb) <= 1.5
    k8s = [KUBERNETES.sample(rng) for _ in range(500)]
    assert min(k8s) >= 330.0 and max(k8s) <= 345.0


def test_trace_arrivals_and_unschedulable_pipeline_is_rejected_not_fatal() -> None:
    gpu_only = TaskGraph([Task("x", kinds=frozenset({"tpu"}))], {})
    ok = _chain(2)
    arrivals = trace_arrivals([gpu_only, ok], [0.0, 1.0])
    r = Simulator(_two_devices(), LinkCostModel(), make_policy("portfolio"), arrivals).run()
    assert r.pipelines[0].rejected.startswith("unschedulable")
    assert r.pipelines[1].completed is not None


def test_large_cluster_uses_candidates_and_stays_fast() -> None:
    cluster, links = tiered_cluster(2_000, seed=1)
    graphs = [random_dag(50, ccr=1.0, seed=s, bandwidth_Bps=WAN) for s in range(4)]
    r = Simulator(
        cluster,
        LinkCostModel(links),
        make_policy("portfolio"),
        poisson_arrivals(graphs, 1.0, seed=1),
    ).run()
    assert all(p.completed == p.planned_finish for p in r.pipelines)
    used = {e.device_id for e in r.executions}
    assert len(used) <= 4 * 64
    assert r.wall_s < 10.0


def test_policies_carry_their_state_from_pipeline_to_pipeline() -> None:
    """Round-robin resumes after its last device; least-loaded counts others' booked work."""
    import numpy as np

    from orchestrator.scheduling import Cluster, Device, MatrixCostModel, Task, TaskGraph
    from sim.policies import Occupancy

    devs = [Device(f"d{j}", f"a{j}", "s") for j in range(3)]
    cluster = Cluster(devs)
    graph = TaskGraph([Task("t")], {})
    cost = MatrixCostModel({"t": {d.id: 1.0 for d in devs}})
    idle = Occupancy(0.0, np.zeros(3), np.zeros(3))
    rr = make_policy("round-robin")
    got = [
        rr.plan(graph, cluster, cost, fixed={}, now=0.0, occ=idle).placements["t"].device_id
        for _ in range(4)
    ]
    assert got == ["d0", "d1", "d2", "d0"]
    busy = Occupancy(0.0, np.array([4.0, 1.0, 2.0]), np.zeros(3))
    ll = make_policy("least-loaded").plan(graph, cluster, cost, fixed={}, now=0.0, occ=busy)
    assert ll.placements["t"].device_id == "d1"
