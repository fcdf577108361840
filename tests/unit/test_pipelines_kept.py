"""How many finished pipelines an orchestrator keeps in memory: bounded, trimmed in steps,
never a live one."""

from __future__ import annotations

from orchestrator.service import MAX_PIPELINES_KEPT, TRIM_STEP, Orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec

SPEC = PipelineSpec.model_validate(
    {"name": "p", "tasks": [{"id": "a", "run": {"kind": "synthetic", "seconds": 0.001}}]}
)


async def test_finished_pipelines_are_trimmed_and_live_ones_kept() -> None:
    orch = Orchestrator("nats://127.0.0.1:1")
    live: list[str] = []
    sizes = []
    for i in range(4 * MAX_PIPELINES_KEPT):
        run = PipelineRun(f"p{i}", SPEC, 0.0)
        orch.remember(run)
        if i % 10 == 0:
            live.append(run.pipeline_id)  # still running
        else:
            run.finish("succeeded", "", 1.0)
        sizes.append(len(orch.pipelines))
    assert all(pid in orch.pipelines for pid in live)
    assert max(sizes) <= MAX_PIPELINES_KEPT + TRIM_STEP + len(live)
    assert min(sizes[MAX_PIPELINES_KEPT:]) >= MAX_PIPELINES_KEPT
    # the newest finished ones are the ones kept
    assert f"p{4 * MAX_PIPELINES_KEPT - 1}" in orch.pipelines
    assert "p1" not in orch.pipelines
