"""The next placement plans while the one before's bookings are still on their way: it sees
their windows, so it plans around them instead of waiting for their answers (and CAS still
decides every booking). Over a real nats-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestrator import placement
from orchestrator.planning import plan_pipeline
from orchestrator.reservations.store import Cached, device_key
from schemas import PipelineSpec
from tests.harness import agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def one_task(name: str) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.05}}]}
    )


async def test_a_plan_made_while_bookings_travel_works_around_them(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=1)})
    key = device_key("a", "cpu0")
    seen: dict[str, dict[str, Cached]] = {}
    planned = asyncio.Event()
    real_plan = plan_pipeline

    def plan(spec: PipelineSpec, *a: Any, **kw: Any) -> Any:
        seen[spec.name] = kw["bookings"]
        if spec.name == "second":
            planned.set()
        return real_plan(spec, *a, **kw)

    monkeypatch.setattr(placement, "plan_pipeline", plan)
    real_write = orch.store._write
    writing, answer = asyncio.Event(), asyncio.Event()

    async def slow_write(*a: Any, **kw: Any) -> int:
        """The first booking's write waits for the test: its answer is 'on its way'."""
        if not writing.is_set():
            writing.set()
            await answer.wait()
        return await real_write(*a, **kw)

    monkeypatch.setattr(orch.store, "_write", slow_write)
    try:
        first = asyncio.create_task(orch.submit_spec(one_task("first"), "p1"))
        await asyncio.wait_for(writing.wait(), 10.0)
        second = asyncio.create_task(orch.submit_spec(one_task("second"), "p2"))
        # planned while the first booking is unanswered (before, it waited for the answer)
        await asyncio.wait_for(planned.wait(), 10.0)
        held = seen["second"].get(key)
        assert held is not None, "the first's window was not shown to the second plan"
        assert [(w.pipeline_id, w.task_id) for w in held.book.windows] == [("p1", "t")]
        answer.set()
        replies = await asyncio.gather(first, second)
        assert [r.state for r in replies] == ["running", "running"]
        runs = [await orch.wait_terminal(pid, 20.0) for pid in ("p1", "p2")]
        assert [r.state for r in runs] == ["succeeded", "succeeded"]
        assert runs[1].conflicts == 0  # it planned around the first's window
        (_, s1, e1), (_, s2, e2) = runs[0].windows["t"], runs[1].windows["t"]
        assert e1 <= s2 or e2 <= s1  # one slot: the two windows do not overlap
        assert orch.store._held == {}  # nothing shown as on its way once answered
    finally:
        answer.set()
        await stop_cluster(orch, agents)
