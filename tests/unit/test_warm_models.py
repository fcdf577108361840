"""A cold start costs a load: agents advertise the models they hold a session of
(`AgentAdvert.warm_models`, wire level 7), and placement adds the model's load (the one
reported on the device, else a prior) to an ONNX task's time on a device whose agent holds
none, and nothing where it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_agent.executors import OnnxExecutor
from orchestrator.placement.planning import SpecCostModel, plan_pipeline, warm_models
from orchestrator.placement.registry import ClusterView
from orchestrator.predictor.model import LOAD_PRIOR_BPS, LOAD_PRIOR_S, Predictor
from orchestrator.scheduling import Cluster, Device, Task
from schemas import AgentAdvert, DeviceSpec, PipelineSpec
from schemas.agent import MAX_WARM_MODELS
from schemas.codec import decode, encode
from schemas.pipeline import OnnxRun
from schemas.wire import ADDED, WIRE_LEVEL, dump_for

CPU = DeviceSpec(device_id="cpu0", kind="cpu", gflops=10.0)
ONNX = {"id": "t", "run": {"kind": "onnx", "model": "tiny_cnn", "random_inputs": True}}
SLEEP = {"id": "s", "run": {"kind": "synthetic", "seconds": 0.1}}


def _advert(aid: str, warm: list[str] | None = None, gflops: float = 10.0) -> AgentAdvert:
    return AgentAdvert(
        agent_id=aid, incarnation="i", site="s", tier="edge",
        devices=[CPU.model_copy(update={"gflops": gflops})], warm_models=warm or [],
    )  # fmt: skip


# -- the advert ---------------------------------------------------------------------------------
def test_warm_models_are_model_names_as_tasks_give_them_and_bounded() -> None:
    assert _advert("a").warm_models == []
    names = ["tiny_cnn", "sub/m.onnx", f"m@{'ab' * 32}"]
    adv = _advert("a", names)
    assert decode(encode(adv), AgentAdvert).warm_models == names
    # each a name an ONNX task may give (`OnnxRun.model`): never a path out of the models dir
    for bad in ["", "../x.onnx", "/etc/passwd", "a/../../b", "x" * 1025]:
        with pytest.raises(ValidationError):
            _advert("a", [bad])
        with pytest.raises(ValidationError):
            OnnxRun(model=bad)
    _advert("a", [f"m{i}" for i in range(MAX_WARM_MODELS)])
    with pytest.raises(ValidationError):
        _advert("a", [f"m{i}" for i in range(MAX_WARM_MODELS + 1)])


def test_warm_models_are_sent_from_level_7_only() -> None:
    assert WIRE_LEVEL == 7 and ADDED[AgentAdvert]["warm_models"] == 7
    adv = _advert("a", ["tiny_cnn"])
    assert dump_for(adv, 7, "json")["warm_models"] == ["tiny_cnn"]
    assert "warm_models" not in dump_for(adv, 6, "json")
    assert json.loads(adv.model_dump_json())["warm_models"] == ["tiny_cnn"]


# -- the agent's executor -----------------------------------------------------------------------
async def test_the_executor_names_the_models_it_holds_a_session_of() -> None:
    ex = OnnxExecutor()
    told: list[list[str]] = []
    ex.on_warm_change = lambda: told.append(ex.warm_models())
    assert ex.warm_models() == []
    run = OnnxRun(model="tiny_cnn", random_inputs=True)
    await ex.run(run, CPU)
    assert ex.warm_models() == ["tiny_cnn"] and told == [["tiny_cnn"]]
    await ex.run(run, CPU)  # ready: nothing new to say
    assert told == [["tiny_cnn"]]
    # another name of the same file shares its session: warm too, said once
    await ex.run(OnnxRun(model="tiny_cnn.onnx", random_inputs=True), CPU)
    assert ex.warm_models() == ["tiny_cnn", "tiny_cnn.onnx"] and len(told) == 2
    path = ex.model_path("tiny_cnn")
    assert path is not None
    ex.forget(path)  # the file gone (an artifact evicted): so are its sessions
    assert ex.warm_models() == [] and told[-1] == [] and len(told) == 3


def test_the_executor_names_its_most_recently_run_models_only(tmp_path: Path) -> None:
    ex = OnnxExecutor(str(tmp_path))
    told: list[int] = []
    ex.on_warm_change = lambda: told.append(1)
    path = tmp_path / "m.onnx"
    for i in range(MAX_WARM_MODELS + 2):
        ex._ran(f"m{i}", path)
    assert ex.warm_models() == sorted(f"m{i}" for i in range(2, MAX_WARM_MODELS + 2))
    assert len(told) == MAX_WARM_MODELS + 2
    ex._ran(f"m{MAX_WARM_MODELS + 1}", path)  # among those named: nothing new
    assert len(told) == MAX_WARM_MODELS + 2
    ex._ran("m0", path)  # back among them (m2 out): said
    assert len(told) == MAX_WARM_MODELS + 3 and "m0" in ex.warm_models()
    assert "m2" not in ex.warm_models()
    for i in range(10 * MAX_WARM_MODELS):  # names for one file never grow it unbounded
        ex._ran(f"n{i}", path)
    assert len(ex._warm) == 4 * MAX_WARM_MODELS


# -- the cost model -----------------------------------------------------------------------------
def _cost(
    spec: PipelineSpec, warm: dict[str, list[str]] | None, predictor: Predictor
) -> tuple[SpecCostModel, dict[str, Device]]:
    devices = {"a:cpu0": CPU, "b:cpu0": CPU}
    cost = SpecCostModel(spec, devices, {}, predictor, warm=warm)
    return cost, {k: Device(id=k, agent_id=k[0], site="s") for k in devices}


def test_the_load_is_charged_exactly_where_the_model_is_not_warm() -> None:
    p = Predictor()
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [ONNX, SLEEP]})
    onnx, sleep = Task(id="t"), Task(id="s")
    cost, dev = _cost(spec, {"tiny_cnn": ["a:cpu0"]}, p)
    run = cost.estimate("t", "a:cpu0")[0]
    assert cost.estimate("t", "b:cpu0")[0] == run  # the same device twice
    # no load reported anywhere yet: the prior, on the model's weights (float32)
    g = p.book.get("tiny_cnn", 1)
    assert g is not None and g.params > 0
    prior = LOAD_PRIOR_S + 4.0 * g.params / LOAD_PRIOR_BPS
    assert p.load_prior(spec.tasks[0]) == prior
    assert cost.compute_time(onnx, dev["a:cpu0"]) == run
    assert cost.compute_time(onnx, dev["b:cpu0"]) == run + prior
    m = cost.compute_matrix([onnx, sleep], Cluster(list(dev.values())))
    assert m[0].tolist() == [run, run + prior]
    sleep_s = cost.estimate("s", "a:cpu0")[0]
    assert m[1].tolist() == [sleep_s, sleep_s]  # a task that loads no model: never
    # a cold run reported on b: its load, not the prior, from then on
    p.observe(spec.tasks[0], "b:cpu0", CPU, run, 0.0, base_s=run, cold=True, load_s=0.25)
    assert p.load_estimate(spec.tasks[0], "b:cpu0") == 0.25
    cost, dev = _cost(spec, {"tiny_cnn": ["a:cpu0"]}, p)
    assert cost.compute_time(onnx, dev["b:cpu0"]) == cost.estimate("t", "b:cpu0")[0] + 0.25
    assert cost.compute_time(onnx, dev["a:cpu0"]) == cost.estimate("t", "a:cpu0")[0]
    # warm everywhere: no load; nobody says (None): none charged (tools, older callers)
    for warm in ({"tiny_cnn": ["a:cpu0", "b:cpu0"]}, None):
        cost, dev = _cost(spec, warm, p)
        for k in dev:
            assert cost.compute_time(onnx, dev[k]) == cost.estimate("t", k)[0]
    # warm as another name (or another model): not this task's, charged
    cost, dev = _cost(spec, {"tiny_cnn.onnx": ["a:cpu0"], "digits": ["a:cpu0"]}, p)
    assert cost.compute_time(onnx, dev["a:cpu0"]) == cost.estimate("t", "a:cpu0")[0] + prior


def test_the_view_lists_where_each_model_is_warm_as_adverts_say() -> None:
    view = ClusterView()
    view.on_advert(_advert("a", ["tiny_cnn"]), 0.0)
    view.on_advert(_advert("b"), 0.0)
    assert view.warm_models() == {"tiny_cnn": ["a:cpu0"]}
    view.on_advert(_advert("b", ["tiny_cnn", "digits"]), 0.0)  # a change: seen at once
    assert view.warm_models() == {"tiny_cnn": ["a:cpu0", "b:cpu0"], "digits": ["b:cpu0"]}
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [SLEEP]})
    assert warm_models(view, spec) is None  # no ONNX task: nothing looked up, none charged


@pytest.mark.parametrize("warm_on", ["a", "b"])
def test_planning_prefers_the_device_holding_the_model_warm(warm_on: str) -> None:
    """Two agents alike but for the model's session: the task goes where it is warm, planned
    at its run time alone; on neither, it is planned with the load."""
    view = ClusterView()
    for aid in ("a", "b"):
        view.on_advert(_advert(aid, ["tiny_cnn"] if aid == warm_on else []), 0.0)
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [ONNX]})
    p = Predictor()
    planned = plan_pipeline(spec, view, 0.1, predictor=p)
    at = planned.plan.placements["t"]
    assert at.device_id == f"{warm_on}:cpu0"
    run = planned.cost.estimate("t", at.device_id)[0]
    assert at.finish - at.start == pytest.approx(run, rel=1e-12)
    cold = ClusterView()
    for aid in ("a", "b"):
        cold.on_advert(_advert(aid), 0.0)
    at = plan_pipeline(spec, cold, 0.1, predictor=p).plan.placements["t"]
    assert at.finish - at.start == pytest.approx(run + p.load_prior(spec.tasks[0]), rel=1e-12)


def test_a_warm_slower_device_wins_only_while_the_load_outweighs_its_slowness() -> None:
    """b runs twice as fast; a holds the model warm. The load (reported on b) decides."""
    task = {**ONNX, "run": {**ONNX["run"], "batch": 64, "iterations": 100}}  # type: ignore[dict-item]
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [task]})
    view = ClusterView()
    view.on_advert(_advert("a", ["tiny_cnn"], gflops=10.0), 0.0)
    view.on_advert(_advert("b", [], gflops=20.0), 0.0)
    p = Predictor(use_model=False)  # the prior: time in proportion to speed
    planned = plan_pipeline(spec, view, 0.1, predictor=p)
    slow, fast = planned.cost.estimate("t", "a:cpu0")[0], planned.cost.estimate("t", "b:cpu0")[0]
    assert fast < slow
    for load, where in ((slow - fast) * 2, "a:cpu0"), ((slow - fast) / 2, "b:cpu0"):
        q = Predictor(use_model=False)
        q.observe(spec.tasks[0], "b:cpu0", CPU, fast, 0.0, base_s=fast, cold=True, load_s=load)
        assert plan_pipeline(spec, view, 0.1, predictor=q).plan.placements["t"].device_id == where
