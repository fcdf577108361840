"""What a plan charges for data: each edge at the producer's measured output size once it
ran, and each task the fetch of what it reads from the object store where it would run
(pipeline inputs everywhere, its artifact only on agents that do not hold it)."""

from __future__ import annotations

import pytest

from orchestrator.placement.planning import plan_pipeline, to_graph
from orchestrator.placement.registry import ClusterView
from orchestrator.predictor.model import LOAD_PRIOR_BPS, LOAD_PRIOR_S
from orchestrator.state.reads import StoreReads, store_reads
from schemas import AgentAdvert, DeviceSpec, PipelineSpec
from schemas.agent import LinkSpec

SHA = "ab" * 32
#: The edge site's link to the cloud site: 20 ms, 80 Mbit/s (10 MB/s).
LINK = LinkSpec(to_site="dc", latency_ms=20.0, bandwidth_mbps=80.0)


def _advert(aid: str, site: str, gflops: float, held: tuple[str, ...] = ()) -> AgentAdvert:
    return AgentAdvert(
        agent_id=aid, incarnation="i", site=site, tier="cloud" if site == "dc" else "edge",
        devices=[DeviceSpec(device_id="cpu0", kind="cpu", gflops=gflops)],
        links=[] if site == "dc" else [LINK], artifacts=list(held),
    )  # fmt: skip


def _view(a_holds: bool, b_holds: bool = False) -> ClusterView:
    """A cloud agent (where the store is), and two edge agents: b twice as fast as a."""
    view = ClusterView()
    view.on_advert(_advert("c", "dc", 10.0), 0.0)
    view.on_advert(_advert("a", "e", 10.0, (SHA,) if a_holds else ()), 0.0)
    view.on_advert(_advert("b", "e", 20.0, (SHA,) if b_holds else ()), 0.0)
    return view


def _spec(**extra: object) -> PipelineSpec:
    task = {"id": "t", "run": {"kind": "onnx", "model": f"m@{SHA}"},
            "profile": {"flops": 1e10}, "requires": {"tiers": ["edge"]}, **extra}  # fmt: skip
    return PipelineSpec.model_validate({"name": "p", "tasks": [task]})


def _where(view: ClusterView, spec: PipelineSpec, sizes: dict[str, int]) -> tuple[str, float]:
    p = plan_pipeline(spec, view, 0.1, reads=store_reads(spec, sizes)).plan.placements["t"]
    return p.device_id, p.finish - p.start


def test_an_artifact_fetch_is_charged_only_to_agents_that_do_not_hold_it() -> None:
    spec, fifty_mb = _spec(), {SHA: 50_000_000}  # 5 s over the edge's link
    # (no agent holds a session of the model: each run is charged its load too, a prior on
    # the model's size where the store said it)
    load, load_50mb = LOAD_PRIOR_S, LOAD_PRIOR_S + 50e6 / LOAD_PRIOR_BPS
    # size unknown (the store did not say): nothing charged, the faster agent wins
    dev, dur = _where(_view(a_holds=True), spec, {})
    assert dev == "b:cpu0" and dur == pytest.approx(0.5 + load, rel=0.01)
    # a holds it: b's 0.5 s run plus a 5 s fetch loses to a's 1 s run
    dev, dur = _where(_view(a_holds=True), spec, fifty_mb)
    assert dev == "a:cpu0" and dur == pytest.approx(1.0 + load_50mb, rel=0.01)
    # nobody holds it: both fetch, and the one that runs faster wins, charged its fetch
    dev, dur = _where(_view(a_holds=False), spec, fifty_mb)
    assert dev == "b:cpu0" and dur == pytest.approx(0.5 + 0.02 + 5.0 + load_50mb, rel=0.01)
    # both hold it: no fetch at all
    dev, dur = _where(_view(True, True), spec, fifty_mb)
    assert dev == "b:cpu0" and dur == pytest.approx(0.5 + load_50mb, rel=0.01)


def test_pipeline_inputs_are_charged_wherever_the_task_runs() -> None:
    spec = PipelineSpec.model_validate({
        "name": "p",
        "inputs": [{"name": "frames", "sha256": "cd" * 32, "size": 8_000_000}],
        "tasks": [{"id": "t", "run": {"kind": "python", "entry": "m:f"},
                   "profile": {"flops": 1e10}, "requires": {"tiers": ["edge"]},
                   "inputs": [{"name": "x", "pipeline_input": "frames"}]}],
    })  # fmt: skip
    reads = store_reads(spec, {})
    assert reads == StoreReads(inputs={"t": 8_000_000}, artifacts={})
    dev, dur = _where(_view(a_holds=True), spec, {})
    assert dev == "b:cpu0" and dur == pytest.approx(0.5 + 0.02 + 0.8, rel=0.01)


def test_a_cloud_agent_fetches_at_its_own_sites_speed() -> None:
    spec = _spec(requires={"tiers": ["cloud"]})
    dev, dur = _where(_view(a_holds=False), spec, {SHA: 50_000_000})
    # the default LAN (1 Gbit/s class) is far faster than the edge's 10 MB/s
    assert dev == "c:cpu0" and 1.0 < dur < 1.0 + 5.0 / 2


def test_a_replan_sends_what_the_producer_measured_not_what_it_declared() -> None:
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "a", "run": {"kind": "synthetic", "seconds": 0.1}, "output_bytes": 1000},
        {"id": "b", "run": {"kind": "synthetic", "seconds": 0.1}, "deps": ["a"]},
    ]})  # fmt: skip
    assert to_graph(spec).edges[("a", "b")] == 1000.0
    assert to_graph(spec, {"a": 7_000_000}).edges[("a", "b")] == 7_000_000.0
    assert to_graph(spec, {"gone": 5}).edges[("a", "b")] == 1000.0
