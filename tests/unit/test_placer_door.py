"""Placement driven through its door by a stand-in service (tests/unit/doors.py): a real
planner and a real `BookingStore` writing to an in-memory bucket, agents answering offers at
once, no NATS. A pipeline a -> (b, c) of 1 s tasks on agents x and y (one slot each) is
planned a, b on x and c on y."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.placement.placer import PlacementFailed, Placer
from orchestrator.ports import PlacerDoor
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import decode
from schemas.pipeline import PipelineSpec
from schemas.placement import CancelCommand, OfferReply, TaskOffer
from tests.unit.doors import Cancelled, OfferAnswer, PlacerService, Sent, accept, advert, store_on

PID = "p1"
X, Y = "dev.x.cpu0", "dev.y.cpu0"


def spec(**extra: object) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "a", "run": {"kind": "synthetic", "seconds": 1.0}},
        {"id": "b", "run": {"kind": "synthetic", "seconds": 1.0}, "deps": ["a"]},
        {"id": "c", "run": {"kind": "synthetic", "seconds": 1.0}, "deps": ["a"], **extra},
    ]})  # fmt: skip


def service(answer: OfferAnswer = accept) -> tuple[PlacerService, Placer]:
    svc = PlacerService(offer_answer=answer)
    for agent in ("x", "y"):
        svc.view.on_advert(advert(agent), svc.now)
    door: PlacerDoor = svc  # mypy: the stand-in opens placement's door
    return svc, Placer(door)


def new_run(svc: PlacerService, s: PipelineSpec | None = None) -> PipelineRun:
    run = PipelineRun(PID, s or spec(), svc.now)
    run.submitted_wall = svc.wall()
    return run


def booked(svc: PlacerService, key: str) -> list[BookingWindow]:
    """The windows the bucket holds on `key` (none: the key was never written)."""
    entry = svc.kv.entries.get(key)
    if entry is None or entry.value is None:
        return []
    return decode(entry.value, DeviceBookings).windows


def ours(svc: PlacerService, key: str) -> list[str]:
    """The tasks of the pipeline the bucket holds windows for on `key`."""
    return sorted(w.task_id for w in booked(svc, key) if w.pipeline_id == PID)


def refuse(*which: tuple[str, str]) -> OfferAnswer:
    """Agents that refuse the offers of these (task, agent) pairs (not enough memory), and
    take every other."""

    def answer(offer: TaskOffer) -> OfferReply:
        if (offer.task.id, offer.agent_id) not in which:
            return accept(offer)
        return OfferReply(
            pipeline_id=offer.pipeline_id, task_id=offer.task.id, agent_id=offer.agent_id,
            accepted=False, code="no_memory", reason="not enough memory",
        )  # fmt: skip

    return answer


def where(run: PipelineRun) -> dict[str, tuple[str, str | None, int]]:
    return {t: (tr.state, tr.agent_id, tr.token) for t, tr in run.tasks.items()}


async def test_a_placement_books_offers_and_binds_every_task() -> None:
    """Each device's key is booked by CAS with the windows of the tasks planned there (this
    replica's, for the lease); each task is offered once to its agent, with the token the
    commit brings still 0 and its consumers where they run; then bound through the state
    machine: accepted where planned, under the revision of the write that booked it."""
    svc, placer = service()
    run = new_run(svc)
    await placer.place(run)
    assert where(run) == {
        "a": ("accepted", "x", svc.kv.entries[X].revision),
        "b": ("accepted", "x", svc.kv.entries[X].revision),
        "c": ("accepted", "y", svc.kv.entries[Y].revision),
    }
    assert {t: p.device_id for t, p in run.placements.items()} == {
        "a": "x:cpu0", "b": "x:cpu0", "c": "y:cpu0"
    }  # fmt: skip
    assert [p.task_id for p in run.plan] == ["a", "b", "c"] and run.planned_makespan_s > 2.0
    wall = svc.wall()
    for key, tids in ((X, ["a", "b"]), (Y, ["c"])):
        assert ours(svc, key) == tids
        for w in booked(svc, key):
            p = run.placements[w.task_id]
            assert run.windows[w.task_id] == (key, w.start, w.end)
            assert (w.start, w.end) == (wall + p.start, wall + p.finish)
            assert (w.owner, w.expires) == ("orch-1", wall + svc.lease_s)
    assert [(x.task.id, x.agent_id, x.token) for x in svc.offers] == [
        ("a", "x", 0), ("b", "x", 0), ("c", "y", 0)
    ]  # fmt: skip
    a = svc.offers[0]
    assert [(c.task_id, c.agent_id) for c in a.consumers] == [("b", "x"), ("c", "y")]
    assert [(i.task_id, i.agent_id) for i in svc.offers[2].inputs] == [("a", "x")]
    assert svc.cancelled == [] and svc.sent == [] and run.placement_log == []
    assert (run.conflicts, run.rejections) == (0, 0)


async def test_an_offer_refused_is_planned_elsewhere_and_gives_its_window_back() -> None:
    """y refuses c: c's window on y is given back, c is ruled out there and planned again
    (on x, after b), everything else held where it was; the offers taken are sent again with
    their tokens and where c now runs. Nothing taken had to be withdrawn."""
    svc, placer = service(refuse(("c", "y")))
    run = new_run(svc)
    await placer.place(run)
    assert ours(svc, Y) == [] and ours(svc, X) == ["a", "b", "c"]
    assert {t: p.device_id for t, p in run.placements.items()} == {
        "a": "x:cpu0", "b": "x:cpu0", "c": "x:cpu0"
    }  # fmt: skip
    assert run.placements["c"].start >= run.placements["b"].finish  # one slot: after b
    # a and b keep the token of the write that booked them; c has that of a later write
    assert where(run)["c"] == ("accepted", "x", svc.kv.entries[X].revision)
    assert where(run)["a"][1:] == where(run)["b"][1:] == ("x", 1) and where(run)["c"][2] > 1
    assert run.rejections == 1
    assert any("y rejected c (no_memory" in line for line in run.placement_log)
    to_y = [(x.task.id, x.token) for x in svc.offers if x.agent_id == "y"]
    assert to_y == [("c", 0)]  # offered there once, never again
    last_a = [x for x in svc.offers if x.task.id == "a"][-1]
    assert last_a.token == where(run)["a"][2]
    assert [(c.task_id, c.agent_id) for c in last_a.consumers] == [("b", "x"), ("c", "x")]
    assert svc.cancelled == []


async def test_a_booking_lost_to_another_replica_is_planned_again() -> None:
    """Another replica booked y's only slot, which this replica's cache has not seen: its
    write on y is refused, the key read again and the overlap found. c (offered with the
    bookings, and taken) is withdrawn from y and planned again on x; the other replica's
    window stays, and this pipeline holds none on y."""
    svc, placer = service()
    wall = svc.wall()
    theirs = BookingWindow(
        pipeline_id="q9", task_id="t", slot=0, start=wall, end=wall + 3600.0,
        expires=wall + 3600.0, owner="orch-2", submitted=wall,
    )  # fmt: skip
    assert (await store_on(svc.kv).book(Y, [theirs], wall)).ok
    assert Y not in svc.store.cache  # this replica has not seen it
    run = new_run(svc)
    await placer.place(run)
    assert (run.conflicts, run.cas_retries) == (1, 1)
    assert any(f"conflict on {Y} with q9/t" in line for line in run.placement_log)
    assert svc.cancelled == [Cancelled(PID, {"c": "y:cpu0"}, "re-planned after a conflict", 0)]
    assert {t: p.device_id for t, p in run.placements.items()} == {
        "a": "x:cpu0", "b": "x:cpu0", "c": "x:cpu0"
    }  # fmt: skip
    assert {t: s for t, (s, _, _) in where(run).items()} == dict.fromkeys("abc", "accepted")
    assert where(run)["c"][1:] == ("x", svc.kv.entries[X].revision)
    assert booked(svc, Y) == [theirs] and ours(svc, X) == ["a", "b", "c"]


async def test_no_device_left_fails_the_placement_with_nothing_booked() -> None:
    """Every agent refuses every offer: each round rules out what was refused and gives its
    windows back, until no device is left for some task. The placement fails saying why per
    task and device, leaves no window in the bucket and no task bound, and every offer sent
    is withdrawn from each agent it went to, under the highest token offered there."""
    svc, placer = service(refuse(*((t, a) for t in "abc" for a in "xy")))
    run = new_run(svc)
    with pytest.raises(PlacementFailed) as failed:
        await placer.place(run)
    assert failed.value.details == {
        f"{t}@{a}:cpu0": "no_memory: not enough memory" for t in "abc" for a in "xy"
    }
    assert svc.kv.entries and all(ours(svc, key) == [] for key in svc.kv.entries)
    assert run.placements == {} and {s for s, _, _ in where(run).values()} == {"pending"}
    await placer.withdrawn(PID)
    await svc.settle()
    offered: dict[str, set[str]] = {}
    top: dict[str, int] = {}
    for x in svc.offers:
        offered.setdefault(x.agent_id, set()).add(x.task.id)
        top[x.agent_id] = max(top.get(x.agent_id, 0), x.token)
    assert sorted(svc.sent, key=lambda s: s.agent_id) == [
        Sent(
            subjects.cancel(agent), agent,
            CancelCommand(
                pipeline_id=PID, reason="placement failed", task_ids=sorted(tids),
                max_token=top[agent],
            ),
            asked=False,
        )
        for agent, tids in sorted(offered.items())
    ]  # fmt: skip
    assert run.rejections == len(svc.offers)


async def test_a_task_no_device_can_run_fails_before_anything_is_booked() -> None:
    """c needs a GPU and the fleet has none: the placement fails saying so, with nothing
    offered, booked or to withdraw."""
    svc, placer = service()
    run = new_run(svc, spec(requires={"kinds": ["gpu"]}))
    with pytest.raises(PlacementFailed):
        await placer.place(run)
    assert svc.offers == [] and svc.kv.entries == {} and svc.cancelled == []
    await placer.withdrawn(PID)
    await svc.settle()
    assert svc.sent == [] and svc.spawned == []


async def test_the_portfolio_budget_is_spent_only_when_one_placement_is_under_way() -> None:
    """Alone, a plan gets the portfolio's extra time; while another placement is under way
    (queued behind the planner) it gets none, and the count of placements under way returns
    to 0 however they end (the first here fails at its ownership gate)."""
    svc, placer = service()
    svc.plan_budget_s = 0.002
    at_gate, release = asyncio.Event(), asyncio.Event()

    async def gate() -> None:
        at_gate.set()
        await release.wait()
        raise RuntimeError("the claim was lost")

    first = asyncio.create_task(placer.place(new_run(svc), gate=gate()))
    await at_gate.wait()  # planned, holding the booking lock
    assert (placer.placing, placer.budget_s(20), placer.budget_s(100)) == (1, 0.002, 0.05)
    second = asyncio.create_task(placer.place(PipelineRun("p2", spec(), svc.now)))
    await asyncio.sleep(0)  # one loop turn: the new task takes its first step, then queues
    assert (placer.placing, placer.budget_s(20), placer.budget_s(100)) == (2, 0.0, 0.0)
    release.set()
    with pytest.raises(RuntimeError, match="claim was lost"):
        await first
    await second  # placed once the first let go of the planner
    assert placer.placing == 0
