"""Money a user can reach: prices from agents' adverts in the plan's cost, a pipeline's budget
and money weight in the objective it is planned by, and the refusal of a budget no plan fits."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from edge_agent.config import AgentConfig
from edge_agent.discover import priced
from orchestrator.placement.placer import PlacementFailed, Placer
from orchestrator.placement.planning import Planned, plan_pipeline
from orchestrator.placement.pricing import OverBudget, objective_of
from orchestrator.placement.registry import ClusterView
from orchestrator.ports import PlacerDoor
from orchestrator.scheduling import Objective
from orchestrator.state.pipelines import PipelineRun
from schemas import AgentAdvert, DeviceSpec, PipelineSpec
from schemas.agent import LinkSpec
from schemas.api import StatusReply, SubmitReply
from schemas.codec import decode, encode
from schemas.wire import code_for
from tests.unit.doors import PlacerService

#: $/hour of the cloud agent's device (1 cent a second) and of the edge agent's (a tenth).
FAST_PRICE, CHEAP_PRICE = 36.0, 3.6
#: $/GB of data between the two sites.
PER_GB = 2.0


def _advert(aid: str, site: str, gflops: float, price: float) -> AgentAdvert:
    link = LinkSpec(to_site="dc", latency_ms=1.0, bandwidth_mbps=1e7, cost_per_gb=PER_GB)
    return AgentAdvert(
        agent_id=aid,
        incarnation="i",
        site=site,
        tier="cloud" if site == "dc" else "edge",
        devices=[DeviceSpec(device_id="cpu0", kind="cpu", gflops=gflops, cost_per_hour=price)],
        links=[] if site == "dc" else [link],
    )


def _view() -> ClusterView:
    """A cloud agent 4x as fast as the edge agent and 10x its price; a fast link between
    them that charges PER_GB."""
    view = ClusterView()
    view.on_advert(_advert("fast", "dc", 40.0, FAST_PRICE), 0.0)
    view.on_advert(_advert("cheap", "e", 10.0, CHEAP_PRICE), 0.0)
    return view


def _spec(**money: Any) -> PipelineSpec:
    """One task of 1 s on the edge agent (0.25 s on the cloud one)."""
    task = {"id": "t", "run": {"kind": "synthetic", "seconds": 1.0, "ref_gflops": 10.0}}
    return PipelineSpec.model_validate({"name": "p", "tasks": [task], **money})


def _expected_cost(planned: Planned) -> float:
    """Device time at each device's price plus bytes crossing sites at PER_GB."""
    prices = {"fast:cpu0": FAST_PRICE, "cheap:cpu0": CHEAP_PRICE}
    sites = {"fast:cpu0": "dc", "cheap:cpu0": "e"}
    ps = planned.plan.placements
    run = sum((p.finish - p.start) * prices[p.device_id] / 3600 for p in ps.values())
    moved = sum(
        n for (a, b), n in planned.graph.edges.items()
        if sites[ps[a].device_id] != sites[ps[b].device_id]
    )  # fmt: skip
    return run + moved / 1e9 * PER_GB


def _plan(spec: PipelineSpec, **kw: Any) -> Planned:
    return plan_pipeline(spec, _view(), 0.1, **kw)


def test_a_plan_is_priced_from_the_adverts() -> None:
    planned = _plan(_spec())
    (p,) = planned.plan.placements.values()
    assert p.device_id == "fast:cpu0"  # time alone: the fast device
    assert planned.plan.cost == pytest.approx(_expected_cost(planned), rel=1e-12)
    assert planned.plan.cost == pytest.approx((p.finish - p.start) * FAST_PRICE / 3600)


def test_data_crossing_sites_pays_the_declared_link_price() -> None:
    # a producer held at the edge sends 1 GB to a task 4x as fast in the cloud
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "src", "run": {"kind": "synthetic", "seconds": 0.1, "ref_gflops": 10.0},
         "output_bytes": 1_000_000_000, "requires": {"pinned_agent": "cheap"}},
        {"id": "big", "run": {"kind": "synthetic", "seconds": 8.0, "ref_gflops": 10.0},
         "deps": ["src"]},
    ]})  # fmt: skip
    planned = _plan(spec)
    assert planned.plan.placements["big"].device_id == "fast:cpu0"
    cost = planned.plan.cost
    assert cost is not None and cost == pytest.approx(_expected_cost(planned), rel=1e-12)
    assert cost > PER_GB  # the GB moved is in it


def test_the_spec_states_the_objective() -> None:
    assert objective_of(_spec()) is None  # absent: time alone
    assert objective_of(_spec(budget=0.5)) == Objective(budget=0.5)
    assert objective_of(_spec(money_weight=60.0)) == Objective(money_weight=60.0)
    assert objective_of(_spec(budget=0.5, money_weight=60.0)) == Objective(
        money_weight=60.0, budget=0.5
    )


def test_a_budget_picks_the_shortest_plan_within_it() -> None:
    fast = _plan(_spec())
    assert fast.plan.cost is not None
    budget = fast.plan.cost / 2  # the fast device is over it; the cheap one within
    planned = _plan(_spec(budget=budget))
    (p,) = planned.plan.placements.values()
    assert p.device_id == "cheap:cpu0"
    assert planned.plan.cost == pytest.approx(_expected_cost(planned), rel=1e-12)
    assert planned.plan.cost is not None and planned.plan.cost <= budget < fast.plan.cost


@pytest.mark.parametrize("budget_s", [0.0, 0.002])
def test_the_objective_holds_however_busy_the_planner(budget_s: float) -> None:
    """No planning time beyond HEFT (other placements queue): still held to the budget, and
    to a money weight."""
    fast = _plan(_spec()).plan.cost
    assert fast is not None
    for spec in (_spec(budget=fast / 2), _spec(money_weight=1e6)):
        planned = _plan(spec, budget_s=budget_s)
        assert [p.device_id for p in planned.plan.placements.values()] == ["cheap:cpu0"]


def test_a_money_weight_trades_time_for_dollars() -> None:
    # the cloud saves 0.75 s for 0.0015 dollars more (500 s/$): worth it at 60 s/$, not at 1e4
    assert [p.device_id for p in _plan(_spec(money_weight=60.0)).plan.placements.values()] == [
        "fast:cpu0"
    ]
    assert [p.device_id for p in _plan(_spec(money_weight=1e4)).plan.placements.values()] == [
        "cheap:cpu0"
    ]


def test_an_impossible_budget_is_refused_with_the_cheapest_plan_found() -> None:
    cheap = _plan(_spec(money_weight=1e6))
    assert cheap.plan.cost is not None
    budget = cheap.plan.cost / 10
    with pytest.raises(OverBudget) as err:
        _plan(_spec(budget=budget), refuse_over_budget=True)
    assert err.value.cheapest == pytest.approx(cheap.plan.cost, rel=1e-12)
    assert err.value.budget == budget and not err.value.no_devices
    assert err.value.details()["cheapest_cost"] == f"{cheap.plan.cost:.6g}"
    assert f"${cheap.plan.cost:.6g}" in str(err.value)
    # placed again (not a first placement): runs on, at the cheapest plan found
    again = _plan(_spec(budget=budget))
    assert [p.device_id for p in again.plan.placements.values()] == ["cheap:cpu0"]
    assert again.plan.cost == pytest.approx(cheap.plan.cost, rel=1e-12)


@pytest.mark.parametrize(
    "money",
    [
        {"budget": 0.0},
        {"budget": -1.0},
        {"budget": math.inf},
        {"budget": math.nan},
        {"money_weight": -1.0},
        {"money_weight": math.inf},
        {"money_weight": math.nan},
    ],
)
def test_a_bad_budget_or_money_weight_is_refused(money: dict[str, float]) -> None:
    with pytest.raises(ValidationError) as err:
        _spec(**money)
    assert next(iter(money)) in str(err.value)


@pytest.mark.parametrize("price", [-0.5, math.inf, math.nan])
def test_a_bad_price_in_an_agent_config_is_refused(price: float) -> None:
    dev = {"device_id": "cpu0", "kind": "cpu"}
    link = {"to_site": "dc", "latency_ms": 1.0, "bandwidth_mbps": 10.0}
    for raw, where in (
        ({"cost_per_hour": price}, "cost_per_hour"),
        ({"devices": [{**dev, "cost_per_hour": price}]}, "devices.0.cost_per_hour"),
        ({"links": [{**link, "cost_per_gb": price}]}, "links.0.cost_per_gb"),
    ):
        with pytest.raises(ValidationError) as err:
            AgentConfig.model_validate(raw)
        assert where in str(err.value)


def test_an_agent_wide_price_applies_where_a_device_names_none() -> None:
    cfg = AgentConfig.model_validate(
        {"cost_per_hour": 1.5, "devices": [
            {"device_id": "gpu0", "kind": "gpu", "cost_per_hour": 4.0},
            {"device_id": "npu0", "kind": "npu"},
        ]}
    )  # fmt: skip
    probed = DeviceSpec(device_id="cpu0", kind="cpu")
    devices = priced([probed, *cfg.devices], cfg)
    assert {d.device_id: d.cost_per_hour for d in devices} == {
        "cpu0": 1.5, "gpu0": 4.0, "npu0": 1.5
    }  # fmt: skip
    unpriced = AgentConfig()
    assert priced([probed], unpriced) == [probed]  # absent: as advertised (free)


def test_older_peers_hear_no_money_fields() -> None:
    """A level-5 requester is answered without the cost, and `over_budget` as
    `unschedulable`; absent fields read as free / time alone."""
    reply = SubmitReply(
        pipeline_id="p", state="running", algorithm="heft", makespan_s=1.0, plan=[], cost=0.25
    )
    old = decode(encode(reply, "json", level=5), SubmitReply, "json")
    assert old.cost == 0.0 and decode(encode(reply, "json"), SubmitReply, "json").cost == 0.25
    st = StatusReply(pipeline_id="p", name="p", state="running", planned_cost=0.5)
    assert decode(encode(st, "json", level=5), StatusReply, "json").planned_cost == 0.0
    spec = _spec(budget=1.0, money_weight=2.0)
    old_spec = decode(encode(spec, "json", level=5), PipelineSpec, "json")
    assert old_spec.budget is None and old_spec.money_weight == 0.0
    assert code_for("over_budget", 5) == "unschedulable"
    assert code_for("over_budget", 6) == "over_budget"
    assert code_for("unschedulable", 1) == "unschedulable"


def _priced_advert(agent_id: str, price: float, seq: int = 0) -> AgentAdvert:
    return AgentAdvert(
        agent_id=agent_id, incarnation="i1", site="s", tier="edge", seq=seq,
        heartbeat_interval_s=60.0,
        devices=[DeviceSpec(device_id="cpu0", kind="cpu", gflops=10.0, cost_per_hour=price)],
    )  # fmt: skip


def _placing(budget: float) -> tuple[PlacerService, Placer, PipelineRun]:
    """Agents x and y at $3.6/hour each and a pipeline of two 1 s tasks within `budget`."""
    svc = PlacerService()
    for agent in ("x", "y"):
        svc.view.on_advert(_priced_advert(agent, 3.6), svc.now)
    door: PlacerDoor = svc
    spec = PipelineSpec.model_validate({"name": "p", "budget": budget, "tasks": [
        {"id": "a", "run": {"kind": "synthetic", "seconds": 1.0}},
        {"id": "b", "run": {"kind": "synthetic", "seconds": 1.0}, "deps": ["a"]},
    ]})  # fmt: skip
    run = PipelineRun("p1", spec, svc.now)
    run.submitted_wall = svc.wall()
    return svc, Placer(door), run


async def test_a_first_placement_over_budget_books_and_offers_nothing() -> None:
    svc, placer, run = _placing(budget=1e-6)
    with pytest.raises(PlacementFailed) as failed:
        await placer.place(run)
    cause = failed.value.__cause__
    assert isinstance(cause, OverBudget) and cause.budget == 1e-6
    assert cause.cheapest == pytest.approx(2 * 3.6 / 3600, rel=0.01)  # two 1 s tasks
    assert svc.offers == [] and svc.kv.entries == {} and run.placements == {}


async def test_a_pipeline_placed_again_is_not_refused_for_its_budget() -> None:
    """Placed within its budget, then its devices' price goes up tenfold: a re-placement
    keeps it running (at the cheapest plan found), and its planned cost says so."""
    svc, placer, run = _placing(budget=0.01)
    await placer.place(run)
    first = run.planned_cost
    assert first == pytest.approx(2 * 3.6 / 3600, rel=0.01) and first <= 0.01
    for agent in ("x", "y"):
        svc.view.on_advert(_priced_advert(agent, 36.0, seq=1), svc.now)
    await placer.place(run, only={"b"})
    # both tasks priced at today's prices (a, held where it is, too)
    assert run.planned_cost == pytest.approx(first * 10, rel=1e-9)
    assert run.planned_cost > 0.01
