"""Placing and running pipelines leaves no reference cycles behind: the orchestrator turns its
automatic collector off once up (orchestrator/infra/eventloop.py), so garbage that only a collection
frees piles up between its full collections, which then stop the event loop (a cycle per
placement made the benchmark's orchestrator pause 1.3-1.5 s in one)."""

from __future__ import annotations

import gc
from collections import Counter

import pytest

from schemas import PipelineSpec
from tests.harness import EMULATED_CPU, agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def _chain(n: int) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "c", "tasks": [
        {"id": f"t{k}", "run": {"kind": "synthetic", "seconds": 0.001},
         "deps": [f"t{k - 1}"] if k else []}
        for k in range(n)
    ]})  # fmt: skip


async def test_placing_and_running_pipelines_leaves_no_reference_cycles(nats_url: str) -> None:
    configs = {
        f"a{i}": agent_config("s1", "edge", probe_cpu=False, devices=[EMULATED_CPU])
        for i in range(3)
    }
    orch, agents = await start_cluster(nats_url, configs)
    try:
        for i in range(5):  # the first placements warm caches up
            await orch.submit_spec(_chain(6), f"warm{i}")
            await orch.wait_terminal(f"warm{i}", 10.0)
        gc.collect()
        gc.freeze()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for i in range(40):
                await orch.submit_spec(_chain(6), f"p{i}")
                assert (await orch.wait_terminal(f"p{i}", 10.0)).state == "succeeded"
            gc.collect()
            kinds = Counter(type(o).__qualname__ for o in gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.unfreeze()
        assert not kinds, kinds.most_common(10)
    finally:
        await stop_cluster(orch, agents)
