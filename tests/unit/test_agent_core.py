"""Agent admission and readiness, driven synchronously through the state machine."""

from __future__ import annotations

from typing import Any

from edge_agent.core import AgentCore
from schemas import (
    CancelCommand,
    CommitCommand,
    DataTransfer,
    DeviceSpec,
    InputRef,
    OnnxRun,
    TaskOffer,
    TaskSpec,
)

SHA = "0" * 64


def core(**kw: Any) -> AgentCore:
    devices = [DeviceSpec(device_id="cpu0", kind="cpu", slots=1, memory_mb=1000.0)]
    return AgentCore("a1", "inc1", devices, ["synthetic", "onnx"], **kw)


def offer(
    task_id: str = "t", token: int = 1, deps: tuple[str, ...] = (), order: int = 0, **kw: Any
) -> TaskOffer:
    task = TaskSpec.model_validate(
        {
            "id": task_id,
            "run": kw.pop("run", {"kind": "synthetic"}),
            "requires": kw.pop("requires", {}),
        }
    )
    base: dict[str, Any] = dict(
        pipeline_id="p",
        agent_id="a1",
        incarnation="inc1",
        device_id="cpu0",
        token=token,
        order=order,
        task=task,
        inputs=[InputRef(task_id=d, agent_id="a2") for d in deps],
    )
    base.update(kw)
    return TaskOffer(**base)


def test_rejections_carry_codes() -> None:
    c = core(model_problem=lambda run: "model 'x' not found")
    cases = {
        "stale_incarnation": offer(incarnation="old"),
        "unknown_device": offer(device_id="gpu9"),
        "kind_not_allowed": offer(run={"kind": "exec", "argv": ["ls"]}),
        "no_memory": offer(requires={"min_memory_mb": 5000.0}),
        "missing_model": offer(run={"kind": "onnx", "model": "x"}),
        "bad_spec": offer(slot=3),
    }
    for code, o in cases.items():
        r = c.admit(o)
        assert not r.accepted and r.code == code and r.reason, (code, r)
    c.draining = True
    assert c.admit(offer()).code == "draining"


def test_duplicate_offer_is_idempotent_and_stale_token_rejected() -> None:
    c = core()
    assert c.admit(offer(token=5)).accepted
    assert c.admit(offer(token=5)).accepted
    assert len(c.jobs) == 1
    r = c.admit(offer(token=4))
    assert not r.accepted and r.code == "stale_token"


def test_runs_only_when_committed_and_inputs_arrived_in_order_within_slots() -> None:
    c = core()
    assert c.admit(offer("b", deps=("x",), order=2)).accepted
    assert c.admit(offer("a", order=1)).accepted
    assert c.admit(offer("z", order=3)).accepted
    assert c.take_ready() == []  # nothing committed yet
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a", "b", "z"]))
    first = c.take_ready()
    assert [j.offer.task.id for j in first] == ["a"]  # one slot, plan order
    assert c.take_ready() == []
    ack = c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="b", token=1, data=b"1", sha256=SHA)
    )
    assert ack.ok
    c.finish(("p", "a"), ok=True)
    assert [j.offer.task.id for j in c.take_ready()] == ["b"]
    bad = c.deliver(
        DataTransfer(pipeline_id="p", producer="nope", consumer="z", token=1, data=b"", sha256=SHA)
    )
    assert not bad.ok
    # a finished task offered again is recognised
    assert c.admit(offer("a")).code == "duplicate"


def test_cancel_drops_queued_jobs_and_reports_running_ones() -> None:
    c = core()
    c.admit(offer("a", order=1))
    c.admit(offer("b", order=2))
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a", "b"]))
    c.take_ready()
    out = c.cancel(CancelCommand(pipeline_id="p"))
    assert {j.offer.task.id: j.state for j in out} == {"a": "running", "b": "cancelled"}
    assert list(c.jobs) == [("p", "a")]
    c.finish(("p", "a"), ok=False)
    assert c.running_total == 0


def test_onnx_model_check_uses_builtin_models() -> None:
    from edge_agent.executors import OnnxExecutor

    ex = OnnxExecutor()
    assert ex.has_model(OnnxRun(model="tiny_cnn")) is None
    assert "not found" in (ex.has_model(OnnxRun(model="../../etc/passwd")) or "")
    assert "sha256" in (ex.has_model(OnnxRun(model="tiny_cnn", sha256="a" * 64)) or "")
