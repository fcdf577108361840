"""Workloads: WfCommons traces load faithfully, generators are deterministic and on target,
the tiered cluster has realistic numbers, and every app pipeline is schedulable."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from orchestrator.scheduling import LinkCostModel, TaskGraph, heft
from sim.workloads import (
    PIPELINES,
    TIERS,
    ar_offload,
    load_wfinstance,
    parse_wfinstance,
    random_cluster,
    random_dag,
    sensor_fusion,
    tiered_cluster,
    video_analytics,
    wfinstance_dir,
    wfinstance_paths,
)
from sim.workloads.tiered import MBPS

PATHS = wfinstance_paths()
needs_data = pytest.mark.skipif(
    not PATHS, reason=f"WfInstances dataset not found at {wfinstance_dir()} (set MARS_DATASETS)"
)


# --- WfCommons ---------------------------------------------------------------------------


@needs_data
def test_every_wfinstance_loads_with_the_files_task_and_edge_counts() -> None:
    assert len(PATHS) >= 7  # the 7 traces shipped in shared/datasets (plus their LICENSE)
    for path in PATHS:
        wf = load_wfinstance(path)
        spec = json.loads(path.read_text())["workflow"]["specification"]["tasks"]
        parents = {(p, t["id"]) for t in spec for p in t["parents"]}
        assert len(wf.graph) == len(spec), path.name
        assert set(wf.graph.edges) == parents, path.name
        assert wf.name == path.stem
        assert wf.total_work > 0 and math.isfinite(wf.total_bytes)


@needs_data
def test_montage_2mass_is_the_large_one() -> None:
    (path,) = [p for p in PATHS if p.name == "montage-chameleon-2mass-05d-001.json"]
    wf = load_wfinstance(path)
    assert len(wf.graph) == 1738
    assert len(wf.graph.edges) == 4698


@needs_data
def test_edge_bytes_are_the_shared_file_sizes() -> None:
    (path,) = [p for p in PATHS if p.name.startswith("helloworld-forkjoin")]
    graph = load_wfinstance(path).graph
    # 00000001 writes forkjoin_00000001_output.txt (9,090,910 B), which 00000002 reads;
    # 00000002's own output is the only file the join task 00000010 takes from it.
    assert graph.edges[("cpuhog_forkjoin_00000001", "cpuhog_forkjoin_00000002")] == 9090910
    assert graph.edges[("cpuhog_forkjoin_00000002", "cpuhog_forkjoin_00000010")] == 9090910
    assert graph.task("cpuhog_forkjoin_00000001").work == pytest.approx(100.187)


def test_missing_runtimes_and_unshared_files_and_one_sided_edges() -> None:
    doc = {
        "schemaVersion": "1.5",
        "workflow": {
            "specification": {
                "tasks": [
                    {"id": "a", "parents": [], "children": ["b", "c"], "outputFiles": ["f", "g"]},
                    {"id": "b", "parents": ["a"], "children": [], "inputFiles": ["f", "g"]},
                    {"id": "c", "parents": [], "children": [], "inputFiles": ["h"]},
                ],
                "files": [
                    {"id": "f", "sizeInBytes": 10},
                    {"id": "g", "sizeInBytes": 5},
                    {"id": "h", "sizeInBytes": 7},
                ],
            },
            "execution": {"tasks": [{"id": "a", "runtimeInSeconds": 2.5}, {"id": "b"}]},
        },
    }
    wf = parse_wfinstance(doc, name="tiny")
    assert wf.graph.edges == {("a", "b"): 15.0, ("a", "c"): 0.0}  # a->c only in a.children
    assert [t.work for t in wf.graph] == [2.5, 0.0, 0.0]
    assert wf.total_work == 2.5 and wf.total_bytes == 15.0
    with pytest.raises(ValueError, match="WfFormat"):
        parse_wfinstance({"workflow": {}})


def test_dataset_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wfinstances").mkdir()
    (tmp_path / "wfinstances" / "x.json").write_text("{}")
    monkeypatch.setenv("MARS_DATASETS", str(tmp_path))
    assert wfinstance_paths() == [tmp_path / "wfinstances" / "x.json"]
    assert wfinstance_paths(tmp_path / "absent") == []


# --- random DAGs and clusters ------------------------------------------------------------


@pytest.mark.parametrize("v", [1, 2, 10, 57, 200])
def test_random_dag_has_v_tasks_and_edges_only_forward(v: int) -> None:
    g = random_dag(v, ccr=1.0, alpha=0.5 if v > 50 else 1.0, seed=v)
    assert len(g) == v
    assert len(g.topological_order()) == v  # acyclic (TaskGraph refuses cycles)
    for src, dst in g.edges:
        assert int(src[1:]) < int(dst[1:])  # numbered in level order
    sources = [t for t in g.ids if not g.predecessors(t)]
    assert sources == list(g.ids[: len(sources)])  # only the first level has no parents


def test_random_dag_is_deterministic_per_seed() -> None:
    a = random_dag(60, ccr=2.0, seed=5)
    b = random_dag(60, ccr=2.0, seed=5)
    c = random_dag(60, ccr=2.0, seed=6)
    assert a.edges == b.edges and [t.work for t in a] == [t.work for t in b]
    assert a.edges != c.edges


@pytest.mark.parametrize("ccr", [0.1, 1.0, 5.0])
def test_random_dag_hits_the_requested_ccr(ccr: float) -> None:
    bandwidth = 125e6
    for seed in range(4):
        g = random_dag(100, ccr=ccr, mean_work=20.0, bandwidth_Bps=bandwidth, seed=seed)
        mean_transfer = sum(g.edges.values()) / len(g.edges) / bandwidth
        mean_work = sum(t.work for t in g) / len(g)
        assert mean_transfer / mean_work == pytest.approx(ccr, rel=0.25)
        assert 10.0 < mean_work < 30.0


def test_random_dag_shape_follows_alpha() -> None:
    def depth(g: TaskGraph) -> int:
        level: dict[str, int] = {}
        for t in g.topological_order():
            level[t] = 1 + max((level[p] for p in g.predecessors(t)), default=0)
        return max(level.values())

    tall = random_dag(100, ccr=1.0, alpha=0.5, seed=1)
    wide = random_dag(100, ccr=1.0, alpha=2.0, seed=1)
    assert depth(tall) == 20 and depth(wide) == 5


def test_random_cluster_speeds_follow_beta() -> None:
    c = random_cluster(50, beta=0.5, seed=3, mean_speed=2.0)
    assert len(c) == 50
    assert all(1.5 <= d.speed <= 2.5 for d in c)
    assert [d.speed for d in c] == [
        d.speed for d in random_cluster(50, beta=0.5, seed=3, mean_speed=2.0)
    ]
    assert {d.speed for d in random_cluster(4, beta=0.0, seed=1)} == {1.0}


# --- tiered cluster ----------------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 10, 40])
def test_tiered_cluster_has_every_tier_and_realistic_links(n: int) -> None:
    cluster, links = tiered_cluster(n, seed=n)
    assert len(cluster) == n
    assert {d.tier for d in cluster} == set(TIERS)
    assert any(d.kind in ("gpu", "npu") for d in cluster)
    tier_of = {d.site: d.tier if d.tier != "device" else "edge" for d in cluster}
    sites = sorted(tier_of)
    for a in sites:
        for b in sites:
            assert (a, b) in links or (b, a) in links  # no fallback to the model's defaults
    for (a, b), link in links.items():
        pair = {tier_of[a], tier_of[b]}
        ms, mbps = link.latency_s * 1e3, link.bandwidth_Bps / MBPS
        if a == b and pair != {"cloud"}:
            assert 4 <= ms <= 10 and 100 <= mbps <= 1000, (a, b)
        elif pair == {"edge", "cloud"}:
            assert 100 <= ms <= 150 and 20 <= mbps <= 50, (a, b)
        elif pair in ({"edge", "fog"}, {"fog"}):
            assert 8 <= ms <= 12 and mbps == pytest.approx(1000), (a, b)
        elif pair == {"edge"}:
            assert 16 <= ms <= 24 and mbps == pytest.approx(1000), (a, b)
        expected_egress = 0.09 if tier_of[a] == "cloud" and a != b else 0.0
        assert link.cost_per_gb == expected_egress, (a, b)
    cloud = [d for d in cluster if d.tier == "cloud"]
    assert all(d.cost_per_hour > 0 for d in cloud)
    assert all(d.cost_per_hour == 0 for d in cluster if d.tier in ("device", "edge"))


def test_tiered_cluster_is_deterministic_per_seed() -> None:
    a, la = tiered_cluster(20, seed=1)
    b, lb = tiered_cluster(20, seed=1)
    c, _ = tiered_cluster(20, seed=2)
    assert a.devices == b.devices and la == lb
    assert a.devices != c.devices
    with pytest.raises(ValueError):
        tiered_cluster(3, seed=0)


# --- application pipelines ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PIPELINES))
@pytest.mark.parametrize("n", [4, 12, 30])
def test_every_pipeline_is_planned_by_heft_on_a_tiered_cluster(name: str, n: int) -> None:
    graph = PIPELINES[name]()
    cluster, links = tiered_cluster(n, seed=n)
    cost = LinkCostModel(links)
    plan = heft(graph, cluster, cost)
    plan.validate(graph, cluster, cost)
    for tid, p in plan.placements.items():
        task, dev = graph.task(tid), cluster.device(p.device_id)
        assert not task.tiers or dev.tier in task.tiers
        assert not task.kinds or dev.kind in task.kinds


def test_pipeline_shapes_and_sizes() -> None:
    va = video_analytics(streams=3)
    assert len(va) == 3 * 3 + 1 and va.predecessors("aggregate") == [
        "track_0",
        "track_1",
        "track_2",
    ]
    assert va.edges[("decode_0", "detect_0")] == pytest.approx(50 * 640 * 640 * 3)
    sf = sensor_fusion(sensors=5)
    assert len(sf) == 5 * 2 + 3 and len(sf.predecessors("fuse")) == 5
    cluster, links = tiered_cluster(12, seed=0)
    headset = next(d.id for d in cluster if d.tier == "device")
    ar = ar_offload(headset=headset)
    plan = heft(ar, cluster, LinkCostModel(links))
    assert plan.placements["capture"].device_id == headset
    assert plan.placements["display"].device_id == headset
    assert cluster.device(plan.placements["render"].device_id).kind == "gpu"
