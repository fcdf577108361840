"""A pipeline's re-placements that found no room wait together, per kind, and a success lets
go only of what it placed (no NATS: the orchestrator is built, not started)."""

from __future__ import annotations

import random

from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from sim.fleet import synthetic_pipeline


async def test_a_wait_gathers_dead_agents_and_lets_go_only_of_what_was_placed() -> None:
    orch = Orchestrator("nats://127.0.0.1:1", name="unstarted")
    rec = orch.recovery
    run = PipelineRun("p", synthetic_pipeline(random.Random(1), "p", tasks=3), orch.mono())
    no_room = RuntimeError("no room")
    rec._wait_for_capacity(run, {"t0"}, "gone", {"v1"}, "v1 dead", {"v1": "i1"}, no_room)
    rec._wait_for_capacity(run, {"t1"}, "gone", {"v2"}, "v2 dead", {"v2": "i2"}, no_room)
    [wait] = rec._stuck.values()  # one wait, holding both agents (not the last one only)
    assert wait.gone == {"v1", "v2"} and wait.incarnations == {"v1": "i1", "v2": "i2"}
    assert wait.why == "v1 dead; v2 dead"
    rec._done_waiting("p", "gone", {"v1"}, None, None)  # v1's tasks placed: v2's still wait
    assert wait.gone == {"v2"} and wait.incarnations == {"v2": "i2"}
    assert list(rec._stuck.values()) == [wait]
    rec._done_waiting("p", "gone", {"v2"}, None, None)
    assert not rec._stuck
    # another kind waits apart, and goes with its own success
    rec._wait_for_capacity(run, {"t2"}, "starved", set(), "starved", {}, no_room, frozenset({"t2"}))
    rec._wait_for_capacity(run, {"t0"}, "gone", {"v3"}, "v3 dead", {}, no_room)
    assert {k[1] for k in rec._stuck} == {"starved", "gone"}
    rec._done_waiting("p", "starved", set(), {"t2"}, None)
    assert {k[1] for k in rec._stuck} == {"gone"}
