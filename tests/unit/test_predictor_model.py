"""The shipped ONNX predictor: loads, predicts positive and monotone times, falls back to the
prior where it does not apply, scores many devices in one call, and drives the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.placement.planning import MIN_TASK_S, SpecCostModel, to_graph
from orchestrator.predictor.model import (
    MODEL,
    PRIOR,
    ErrorStats,
    LearnedModel,
    Predictor,
    shipped_model,
    task_signature,
)
from orchestrator.scheduling import Cluster, Device
from schemas import DeviceSpec, PipelineSpec, TaskSpec

CPU = DeviceSpec(device_id="cpu", kind="cpu", gflops=80.0, mem_bandwidth_gbps=12.0,
                 call_overhead_ms=0.09, calibrated=True)  # fmt: skip


def onnx_task(batch: int = 1, model: str = "tiny_cnn", iterations: int = 1) -> TaskSpec:
    return TaskSpec.model_validate(
        {"id": "t", "run": {"kind": "onnx", "model": model, "batch": batch,
                            "iterations": iterations}}
    )  # fmt: skip


@pytest.fixture(scope="module")
def learned() -> LearnedModel:
    m = shipped_model()
    assert m is not None, "orchestrator/predictor/predictor.onnx is missing"
    return m


def test_shipped_model_loads_and_predicts_positive(learned: LearnedModel) -> None:
    est = Predictor(model=learned).estimate([onnx_task(b) for b in (1, 8, 64)], [CPU])
    assert (est.source == MODEL).all()
    assert (est.seconds > 0).all() and np.isfinite(est.seconds).all()
    assert (est.lo <= est.seconds).all() and (est.seconds <= est.hi).all()


def test_monotone_in_flops_for_a_fixed_device(learned: LearnedModel) -> None:
    tasks = [onnx_task(b) for b in (1, 2, 4, 8, 16, 32, 64, 256, 1024, 4096)]
    sec = Predictor(model=learned).estimate(tasks, [CPU]).seconds[:, 0]
    assert (np.diff(sec) > 0).all(), sec
    iters = Predictor(model=learned).estimate([onnx_task(iterations=n) for n in (1, 3)], [CPU])
    assert iters.seconds[1, 0] == pytest.approx(3 * iters.seconds[0, 0])


def test_prior_for_unknown_kinds_and_emulated_devices(learned: LearnedModel) -> None:
    gpu = DeviceSpec(device_id="gpu", kind="gpu", gflops=5000.0, provider="CUDAExecutionProvider")
    npu = DeviceSpec(device_id="npu", kind="npu", gflops=200.0)
    emu = CPU.model_copy(update={"device_id": "emu", "emulated": True})
    est = Predictor(model=learned).estimate([onnx_task()], [CPU, gpu, npu, emu])
    assert est.source.tolist() == [[MODEL, PRIOR, PRIOR, PRIOR]]
    assert est.source_name(0, 1) == "prior"
    assert (est.seconds > 0).all()
    assert est.seconds[0, 1] < est.seconds[0, 2]  # faster device, shorter prior
    # no graph features and no model: the declared-FLOPs prior, unchanged
    plain = TaskSpec.model_validate(
        {"id": "p", "run": {"kind": "exec", "argv": ["x"]}, "profile": {"flops": 1e9}}
    )
    e2 = Predictor(model=learned).estimate([plain], [CPU])
    assert e2.source[0, 0] == PRIOR
    assert e2.seconds[0, 0] == pytest.approx(1e9 / 80e9 + 0.0005)


def test_one_ort_call_for_many_devices_then_cache(learned: LearnedModel) -> None:
    devs = [CPU.model_copy(update={"device_id": f"d{i}", "gflops": 10.0 + i}) for i in range(100)]
    p = Predictor(model=learned)
    first = p.estimate([onnx_task(1), onnx_task(8)], devs)
    assert p.ort_calls == 1
    again = p.estimate([onnx_task(1), onnx_task(8)], devs)
    assert p.ort_calls == 1
    assert np.array_equal(first.seconds, again.seconds)


def test_correction_applies_on_top_of_the_cached_base(learned: LearnedModel) -> None:
    p = Predictor(model=learned)
    t = onnx_task()
    base = p.estimate([t], [CPU], ["a:cpu"]).seconds[0, 0]
    for _ in range(3):
        p.observe(t, "a:cpu", CPU, 2.0 * base, 0.0)
    assert p.estimate([t], [CPU], ["a:cpu"]).seconds[0, 0] == pytest.approx(2.0 * base)
    assert p.estimate([t], [CPU], ["b:cpu"]).seconds[0, 0] == pytest.approx(base)


def test_spec_cost_model_uses_the_predictor(learned: LearnedModel) -> None:
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "cnn", "run": {"kind": "onnx", "model": "tiny_cnn", "batch": 8}},
        {"id": "sleep", "run": {"kind": "synthetic", "seconds": 0.25}, "deps": ["cnn"]},
    ]})  # fmt: skip
    gpu = DeviceSpec(device_id="gpu", kind="gpu", gflops=900.0)
    devices = {"a:cpu": CPU, "b:gpu": gpu}
    p = Predictor(model=learned)
    cost = SpecCostModel(spec, devices, {}, p)
    cluster = Cluster([Device(id=k, agent_id=k[0], site="s", kind=d.kind, speed=d.gflops)
                       for k, d in devices.items()])  # fmt: skip
    graph = to_graph(spec)
    w = cost.compute_matrix(graph.tasks, cluster)
    want = p.estimate(spec.tasks, [CPU, gpu], list(devices)).seconds
    assert want[0].max() < MIN_TASK_S  # planned as the shortest time a plan gives a task
    assert np.array_equal(w, np.maximum(want, MIN_TASK_S))
    assert w[1].tolist() == [0.25, 0.25]
    assert cost.estimate("cnn", "a:cpu")[1] == "model"
    assert cost.estimate("cnn", "b:gpu")[1] == "prior"
    assert cost.compute_time(graph.tasks[0], cluster.devices[0]) == w[0, 0]
    # a learned correction changes what the scheduler sees
    for _ in range(3):
        p.observe(spec.tasks[0], "a:cpu", CPU, 5.0 * w[0, 0], 0.0)
    w2 = SpecCostModel(spec, devices, {}, p).compute_matrix(graph.tasks, cluster)
    assert w2[0, 0] == pytest.approx(5.0 * w[0, 0])


def test_error_stats() -> None:
    s = ErrorStats()
    s.add(1.0, 1.05)
    s.add(2.0, 1.0)
    assert s.n == 2 and s.within_10 == 1
    assert "2 tasks" in s.summary()


def test_exported_graph_equals_numpy_forward(tmp_path) -> None:
    pytest.importorskip("onnx")
    import onnxruntime as ort

    from orchestrator.predictor.features import FEATURE_NAMES
    from orchestrator.predictor.train import Mlp, to_onnx

    rng = np.random.default_rng(3)
    f = len(FEATURE_NAMES)
    sizes = [(f, 32), (32, 32), (32, 1)]
    mlp = Mlp(
        rng.normal(size=f),
        np.abs(rng.normal(size=f)),
        [rng.normal(0, 0.3, s) for s in sizes],
        [rng.normal(0, 0.1, s[1]) for s in sizes],
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(to_onnx(mlp, {"features": "[]"}).SerializeToString())
    x = rng.normal(size=(257, f)).astype(np.float32)
    lr = rng.uniform(-12, 0, 257).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(["seconds"], {"x": x, "log_roofline": lr.reshape(-1, 1)})[0]
    np.testing.assert_allclose(got, mlp.forward32(x, lr), rtol=1e-5)
    np.testing.assert_allclose(np.log(got[:, 0]), mlp.forward(x.astype(np.float64), lr),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_device_sets_past_the_cap_start_over_with_the_same_answers(
    learned: LearnedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every device set gets a small id; past MAX_DEVICE_TABLES the ids, tables and cached
    estimates are dropped together, so no stale entry answers for a new set."""
    from orchestrator.predictor import model as pm

    monkeypatch.setattr(pm, "MAX_DEVICE_TABLES", 3)
    devices = [
        DeviceSpec(device_id=f"cpu{k}", kind="cpu", gflops=20.0 * (k + 1),
                   mem_bandwidth_gbps=12.0, calibrated=True)
        for k in range(7)
    ]  # fmt: skip
    tasks = [onnx_task(b) for b in (1, 8)]
    capped = Predictor(model=learned)
    for _ in range(2):  # twice round: every set is seen again after the caches were dropped
        for d in devices:
            got = capped.estimate(tasks, [d]).seconds
            want = Predictor(model=learned).estimate(tasks, [d]).seconds
            assert np.array_equal(got, want), d.device_id
    assert len(capped._set_ids) <= 3 and len(capped._tables) <= 3


def test_observe_with_the_planned_base_learns_the_same_without_an_inference(
    learned: LearnedModel,
) -> None:
    """The orchestrator passes the uncorrected estimate its plan used: the track learns the
    same as when the predictor estimates it again, and no ONNX Runtime call is made."""
    spec = PipelineSpec.model_validate(
        {"name": "p", "tasks": [{"id": "cnn", "run": {"kind": "onnx", "model": "tiny_cnn"}}]}
    )
    planned = SpecCostModel(spec, {"a:cpu": CPU}, {}, Predictor(model=learned))
    base = planned.base("cnn", "a:cpu")
    assert base is not None and base > 0
    assert planned.base("cnn", "nowhere") is None
    again, kept = Predictor(model=learned), Predictor(model=learned)
    t = spec.tasks[0]
    for actual in (2.0 * base, 2.1 * base, 1.9 * base):
        changed = again.observe(t, "a:cpu", CPU, actual, 0.0)
        calls = kept.ort_calls
        assert kept.observe(t, "a:cpu", CPU, actual, 0.0, base_s=base) == changed
        assert kept.ort_calls == calls
    sig = task_signature(t)
    assert kept.corrections.get(sig, "a:cpu") == again.corrections.get(sig, "a:cpu")


def test_task_signatures_are_stable_and_ignore_id_and_deps() -> None:
    """Signatures key learned corrections in KV: the same work signs the same across
    versions (the run's and the profile's JSON, hashed), whatever its id or dependencies."""
    import hashlib

    from schemas.pipeline import TaskSpec

    runs = [
        {"kind": "synthetic", "seconds": 0.25, "ref_gflops": 10.0},
        {"kind": "onnx", "model": "mlp", "batch": 4, "iterations": 2},
        {"kind": "exec", "argv": ["echo", "hi"]},
        {"kind": "python", "entry": "m:f", "kwargs": {"a": 1, "b": "x"}},
    ]
    for run in runs:
        t = TaskSpec.model_validate({"id": "t", "run": run, "profile": {"flops": 1e9}})
        raw = t.run.model_dump_json() + t.profile.model_dump_json()
        assert task_signature(t) == hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()
        other = t.model_copy(update={"id": "u", "deps": ["t"]})
        assert task_signature(other) == task_signature(t)
    t = TaskSpec.model_validate({"id": "t", "run": runs[0], "profile": {"flops": 1e9}})
    assert task_signature(t) == "6f4bfcea2bea17a9"  # what every version so far wrote


def test_tasks_without_a_known_graph_get_the_prior_with_its_band(learned: LearnedModel) -> None:
    """Declared times are exact (no band); FLOPs-based priors carry the prior's band; tasks
    of all kinds mixed in one call each get their own row."""
    from orchestrator.predictor.model import DECLARED
    from orchestrator.predictor.prior import estimate_seconds

    raws = [
        {"id": "a", "run": {"kind": "synthetic", "seconds": 0.3}},
        {"id": "b", "run": {"kind": "exec", "argv": ["x"]}, "profile": {"flops": 1e9}},
        {"id": "c", "run": {"kind": "synthetic", "seconds": 0.2, "ref_gflops": 40.0}},
        {"id": "d", "run": {"kind": "exec", "argv": ["x"]}, "profile": {"est_seconds": 2.5}},
        {"id": "e", "run": {"kind": "exec", "argv": ["x"]}},
        {"id": "f", "run": {"kind": "onnx", "model": "tiny_cnn"}},
    ]
    tasks = [TaskSpec.model_validate(r) for r in raws]
    gpu = DeviceSpec(device_id="gpu", kind="gpu", gflops=5000.0)
    est = Predictor(model=learned).estimate(tasks, [CPU, gpu])
    declared = {"a", "c", "d"}
    for i, t in enumerate(tasks[:5]):
        for j, dev in enumerate((CPU, gpu)):
            assert est.base[i, j] == estimate_seconds(t, dev), (t.id, dev.device_id)
            if t.id in declared:
                assert est.source[i, j] == DECLARED
                assert est.lo[i, j] == est.hi[i, j] == est.base[i, j]
            else:
                assert est.source[i, j] == PRIOR
                assert est.lo[i, j] < est.base[i, j] < est.hi[i, j]
    assert est.source[5, 0] == MODEL  # the model's row is left to the model


def synthetic(i: int) -> TaskSpec:
    """A task of its own signature (its declared seconds differ)."""
    return TaskSpec.model_validate(
        {"id": f"s{i}", "run": {"kind": "synthetic", "seconds": 0.001 + i * 1e-6}}
    )


def test_the_cache_is_bounded_by_bytes_least_recently_used_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    devs = [CPU.model_copy(update={"device_id": f"d{i}"}) for i in range(10)]
    row = 4 * len(devs) * 8  # bytes of one task's cached figures on these devices
    monkeypatch.setattr("orchestrator.predictor.model.CACHE_BYTES", 3 * row)
    p = Predictor(use_model=False)
    p.estimate([synthetic(0), synthetic(1), synthetic(2)], devs)
    assert p.scored == 3
    p.estimate([synthetic(0)], devs)  # a hit: 0 is now the most recently used
    assert p.scored == 3
    p.estimate([synthetic(3)], devs)  # over the budget: 1, the least recently used, goes
    assert p.scored == 4
    p.estimate([synthetic(0), synthetic(2), synthetic(3)], devs)
    assert p.scored == 4
    p.estimate([synthetic(1)], devs)
    assert p.scored == 5
    # the same signature twice in one call is kept (and counted) once
    p.estimate([synthetic(7), synthetic(7)], devs)
    p.estimate([synthetic(7)], devs)
    assert p.scored == 7


def test_the_placement_benchmarks_task_signatures_all_stay_cached() -> None:
    """5,120 distinct signatures (256 pipelines of 20 random synthetic tasks) on 100 devices:
    after one pass every estimate is a hit (a bound of 4,096 entries missed them all)."""
    devs = [CPU.model_copy(update={"device_id": f"d{i}"}) for i in range(100)]
    tasks = [synthetic(i) for i in range(5120)]
    p = Predictor(use_model=False)
    for k in range(0, len(tasks), 20):
        p.estimate(tasks[k : k + 20], devs)
    assert p.scored == 5120
    for k in range(0, len(tasks), 20):
        p.estimate(tasks[k : k + 20], devs)
    assert p.scored == 5120


def test_the_predictor_keeps_no_task_alive(learned: LearnedModel) -> None:
    """Estimating and learning hold no reference to the task specs they are given: a finished
    pipeline's specs go with it (each is a score of objects every young garbage collection of
    the orchestrator would visit while something else kept them)."""
    import sys

    p = Predictor(model=learned)
    tasks = [onnx_task(1), onnx_task(8, model="tiny_cnn", iterations=2)]
    before = [sys.getrefcount(t) for t in tasks]
    p.estimate(tasks, [CPU])
    p.observe(tasks[0], "cpu", CPU, 0.01, 0.0)
    assert [sys.getrefcount(t) for t in tasks] == before
