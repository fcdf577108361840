"""`mars bookings`: what the bookings bucket holds, read over a real nats-server, as a library
call and as the command an operator runs."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest

from orchestrator.reservations.listing import NoBookings, read_bookings
from orchestrator.reservations.store import BUCKET
from schemas import PipelineSpec
from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster

pytestmark = pytest.mark.integration


def pipeline(name: str, seconds: float, **kw: Any) -> PipelineSpec:
    task = {"id": "t", "run": {"kind": "synthetic", "seconds": seconds}}
    return PipelineSpec.model_validate({"name": name, "tasks": [task], **kw})


async def test_bookings_are_listed_per_device_and_filtered(nats_url: str) -> None:
    rc, _, err = await mars_cli("bookings", "--nats", nats_url)
    assert rc == 2 and f"no bucket {BUCKET}" in err  # nothing ever booked here: said so
    rc, _, err = await mars_cli("bookings", "--nats", "nats://127.0.0.1:1")
    assert rc == 2 and "no servers available" in err  # nobody there: said so, not waited on
    # starts not reported (a started task's window is made non-preemptible: not under test)
    quiet = agent_config("s", "edge", cpu_slots=1, started_event_after_s=60.0)
    orch, agents = await start_cluster(nats_url, {"b": quiet})
    nc = await nats.connect(nats_url)
    try:
        await orch.submit_spec(pipeline("low", 5.0, priority=10, preemptible=True), "low")
        await orch.submit_spec(pipeline("firm", 0.5, priority=5), "firm")  # evicts nothing
        token = orch.pipelines["low"].tasks["t"].token
        js = nc.jetstream()
        kv = await js.key_value(BUCKET)
        await kv.put("dev.x.cpu0", b"\xc1 not msgpack")  # a value no orchestrator wrote

        everything = await read_bookings(js)
        assert [k.key for k in everything] == ["dev.b.cpu0", "dev.x.cpu0"]
        b, x = everything
        assert {(w.pipeline_id, w.task_id) for w in b.windows} == {("low", "t"), ("firm", "t")}
        assert b.revision >= token and b.size > 0 and not b.problem
        assert x.windows == [] and x.problem.startswith("undecodable value")

        (low,) = await read_bookings(js, pipeline="low")
        assert [(w.pipeline_id, w.preemptible, w.priority) for w in low.windows] == [
            ("low", True, 10)
        ]
        assert [k.key for k in await read_bookings(js, device="b:cpu0")] == ["dev.b.cpu0"]
        assert await read_bookings(js, device="dev.nobody.cpu0") == []
        with pytest.raises(NoBookings):
            await read_bookings(js, bucket="NO_SUCH_BUCKET")

        rc, out, err = await mars_cli("bookings", "--nats", nats_url, "--pipeline", "low")
        assert rc == 0, err
        assert "dev.b.cpu0" in out and "low/t" in out and "firm/t" not in out
        assert "dev.x.cpu0" not in out
        rc, out, err = await mars_cli("bookings", "--nats", nats_url, "--device", "no such:dev*")
        assert rc == 2 and "not a device: 'no such:dev*'" in err, err
        rc, out, err = await mars_cli("bookings", "--nats", nats_url, "--json")
        assert rc == 0, err
        listed = {k["key"]: k for k in json.loads(out)}
        assert listed["dev.x.cpu0"]["problem"].startswith("undecodable value")
        firm = [w for w in listed["dev.b.cpu0"]["windows"] if w["pipeline_id"] == "firm"]
        assert len(firm) == 1 and firm[0]["preemptible"] is False
    finally:
        await nc.close()
        await stop_cluster(orch, agents)
