"""An `AgentCore` with two devices (cpu0: 1 slot, gpu0: 2) and offers to it, for the tests
that drive an agent's core directly (no NATS)."""

from __future__ import annotations

from edge_agent.core import AgentCore
from schemas import DeviceSpec, InputRef, TaskOffer, TaskSpec

TASKS = ("t0", "t1", "t2", "t3", "t4", "t5")
PIPELINES = ("p0", "p1")


def core() -> AgentCore:
    devices = [
        DeviceSpec(device_id="cpu0", kind="cpu", slots=1, memory_mb=1000.0),
        DeviceSpec(device_id="gpu0", kind="gpu", slots=2, memory_mb=1000.0),
    ]
    return AgentCore("a1", "inc1", devices, ["synthetic"])


def offer(
    pid: str, tid: str, token: int, order: int, device: str, deps: tuple[str, ...]
) -> TaskOffer:
    return TaskOffer(
        pipeline_id=pid,
        agent_id="a1",
        incarnation="inc1",
        device_id=device,
        token=token,
        order=order,
        task=TaskSpec.model_validate({"id": tid, "run": {"kind": "synthetic"}}),
        inputs=[InputRef(task_id=d, agent_id="a2") for d in deps],
    )
