"""Money end to end over a real nats-server: prices from the agents' configs, a pipeline's
budget in its plan, the plan's cost in the submit and status replies, and a budget no plan
fits refused with the cheapest plan's cost, nothing of it booked or offered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from orchestrator.reservations.listing import read_bookings
from schemas import PipelineSpec, TaskOffer
from schemas.api import SubmitReply
from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster
from transport import connect
from transport.client import Client
from transport.rpc import RemoteError

pytestmark = pytest.mark.integration

#: $/hour: the cloud agent's GPU (declared on the device), the edge agent's CPU (agent-wide).
FAST_PRICE, CHEAP_PRICE = 36.0, 3.6
PRICES = {"fast": FAST_PRICE, "cheap": CHEAP_PRICE}


def configs() -> dict[str, Any]:
    return {
        # 4x as fast as the edge agent, 10x its price; two slots, so a second pipeline finds
        # it as free as the first did
        "fast": agent_config("dc", "cloud", probe_cpu=False, devices=[
            {"device_id": "gpu0", "kind": "gpu", "gflops": 400.0, "slots": 2, "emulated": True,
             "cost_per_hour": FAST_PRICE},
        ], shutdown_grace_s=0.0),
        "cheap": agent_config("edge", "edge", probe_cpu=False, cost_per_hour=CHEAP_PRICE,
                              devices=[{"device_id": "cpu0", "kind": "cpu", "gflops": 100.0,
                                        "emulated": True}], shutdown_grace_s=0.0),
    }  # fmt: skip


def spec(**money: Any) -> PipelineSpec:
    """One task: 30 s on the fast agent, 120 s on the cheap one (none ends during the test,
    so no measured run corrects the predictions it is priced by)."""
    run = {"kind": "synthetic", "seconds": 30.0, "ref_gflops": 400.0}
    return PipelineSpec.model_validate({"name": "job", "tasks": [{"id": "t", "run": run}], **money})


def priced(reply: SubmitReply) -> float:
    """The plan's cost by the agents' prices: each task's planned time at its device's."""
    return sum((p.finish_s - p.start_s) * PRICES[p.agent_id] / 3600 for p in reply.plan)


async def test_a_budget_buys_a_cheaper_plan_and_an_impossible_one_is_refused(
    nats_url: str,
) -> None:
    orch, agents = await start_cluster(nats_url, configs())
    offered: list[str] = []
    real = orch.start_offers

    def noted(offers: Sequence[TaskOffer]) -> Any:
        offered.extend(x.pipeline_id for x in offers)
        return real(offers)

    orch.start_offers = noted  # type: ignore[method-assign]
    client = await Client.connect(nats_url, timeout=10.0)
    try:
        free = await client.submit(spec(), pipeline_id="free")
        assert [p.agent_id for p in free.plan] == ["fast"]  # time alone: the fast agent
        assert free.cost > 0 and free.cost == pytest.approx(priced(free), rel=1e-9)

        # the same pipeline with a budget the fast agent is over: the cheap one, cheaper
        tight = await client.submit(spec(budget=free.cost / 2), pipeline_id="tight")
        assert [p.agent_id for p in tight.plan] == ["cheap"]
        assert tight.cost == pytest.approx(priced(tight), rel=1e-9)
        assert tight.cost <= free.cost / 2 < free.cost
        assert tight.makespan_s > free.makespan_s
        st = await client.status("tight")
        assert (st.planned_cost, st.planned_makespan_s) == (tight.cost, tight.makespan_s)

        # a tenth of the cheapest plan: refused, saying what the cheapest costs
        with pytest.raises(RemoteError) as err:
            await client.submit(spec(budget=tight.cost / 10), pipeline_id="broke")
        env = err.value.envelope
        assert env.code == "over_budget"
        assert env.details["cheapest_cost"] == f"{tight.cost:.6g}"
        assert env.details["budget"] == f"{tight.cost / 10:.6g}"
        assert f"${tight.cost:.6g}" in env.message
        # nothing of it was offered or booked; it ended unschedulable, saying why
        assert "broke" not in offered and {"free", "tight"} <= set(offered)
        js = connect.jetstream(client.nc)
        assert await read_bookings(js, pipeline="broke") == []
        assert [k.key for k in await read_bookings(js, pipeline="tight")] == ["dev.cheap.cpu0"]
        broke = await client.status("broke")
        assert broke.state == "unschedulable" and "budget" in broke.reason
        assert broke.plan == [] and broke.planned_cost == 0.0

        # what `mars status` prints of the plan
        code, out, said = await mars_cli("status", "tight", "--nats", nats_url)
        assert code == 0, said
        assert out.splitlines()[1] == (
            f"plan: {tight.algorithm}, predicted makespan {tight.makespan_s:.3f} s, "
            f"cost ${tight.cost:.6g}"
        )
    finally:
        for pid in ("free", "tight"):
            await client.cancel(pid)
        await client.close()
        await stop_cluster(orch, agents)


async def test_submit_and_status_without_money_fields_still_say_the_cost(
    nats_url: str,
) -> None:
    """No budget, no money weight: planned on time alone, and the reply prices the plan."""
    orch, agents = await start_cluster(nats_url, configs())
    client = await Client.connect(nats_url, timeout=10.0)
    try:
        reply = await client.submit(spec(money_weight=0.0), pipeline_id="p")
        assert [p.agent_id for p in reply.plan] == ["fast"]
        assert reply.cost == pytest.approx(priced(reply), rel=1e-9)
        # the fast agent saves 90 s for 18 cents more (500 s a dollar): at 3600 s a dollar,
        # not worth it
        weighed = await client.submit(spec(money_weight=3600.0), pipeline_id="w")
        assert [p.agent_id for p in weighed.plan] == ["cheap"]
        assert (await client.status("w")).planned_cost == weighed.cost
    finally:
        for pid in ("p", "w"):
            await client.cancel(pid)
        await client.close()
        await stop_cluster(orch, agents)
