"""A task that ends within `started_event_after_s` is reported once, by its end event; a longer
one reports its start on the way, saying how long it had run. Over a real nats-server, read
back from the MARS_EVENTS stream."""

from __future__ import annotations

import nats
import pytest

from schemas import PipelineSpec, subjects
from schemas.codec import decode
from schemas.events import TaskEvent
from tests.harness import agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration
AFTER_S = 0.1


async def stored_events(url: str, pipeline_id: str) -> list[TaskEvent]:
    """Every task event of the pipeline in the stream (the last says none are pending)."""
    nc = await nats.connect(url)
    out: list[TaskEvent] = []
    try:
        sub = await nc.jetstream().subscribe(
            subjects.task_events_of(pipeline_id), ordered_consumer=True
        )
        while True:
            msg = await sub.next_msg(timeout=5)
            out.append(decode(msg.data, TaskEvent))
            if msg.metadata.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def test_a_short_task_is_reported_once_and_a_long_one_says_how_long_it_ran(
    nats_url: str,
) -> None:
    cpu = {"device_id": "cpu0", "kind": "cpu", "gflops": 50.0, "emulated": True, "slots": 2}
    cfg = agent_config("s1", "edge", probe_cpu=False, devices=[cpu], started_event_after_s=AFTER_S)
    orch, agents = await start_cluster(nats_url, {"a": cfg})
    try:
        syn = {"kind": "synthetic", "mode": "sleep"}
        spec = PipelineSpec.model_validate({"name": "p", "tasks": [
            {"id": "short", "run": {**syn, "seconds": 0.005}},
            {"id": "long", "run": {**syn, "seconds": 0.5}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "p1")
        run = await orch.wait_terminal("p1", 20.0)
        assert run.state == "succeeded", run.reason
        # the stream holds, in order per task: short's end; long's start, then its end
        events = await stored_events(nats_url, "p1")
        got = {(e.task_id, e.state): e for e in events}
        assert len(events) == 3 and sorted(got) == [
            ("long", "started"),
            ("long", "succeeded"),
            ("short", "succeeded"),
        ]
        started = got[("long", "started")]
        assert started.duration_s is not None and AFTER_S <= started.duration_s < 0.5
        # the orchestrator dates each start by the time the event says the task had run (not
        # by when the event came, AFTER_S into the long task's run)
        for tid in ("short", "long"):
            tr = run.tasks[tid]
            assert tr.started_s is not None and tr.finished_s is not None
            assert tr.duration_s is not None
            assert tr.finished_s - tr.started_s >= tr.duration_s - AFTER_S / 2, (tid, tr)
    finally:
        await stop_cluster(orch, agents)
