"""The cluster view's cached snapshot and how reservations enter planning."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.placement.planning import with_bookings
from orchestrator.placement.registry import ClusterView
from orchestrator.reservations import book as rules
from orchestrator.reservations.book import Blocking
from orchestrator.reservations.store import Cached
from orchestrator.scheduling.model import Cluster
from schemas import AgentAdvert, DeviceSpec
from schemas.bookings import BookingWindow, DeviceBookings


def advert(aid: str, gflops: float = 10.0, seq: int = 0) -> AgentAdvert:
    return AgentAdvert(
        agent_id=aid,
        incarnation="i1",
        site="s",
        tier="edge",
        seq=seq,
        devices=[DeviceSpec(device_id="cpu0", kind="cpu", slots=2, gflops=gflops)],
    )


def test_snapshot_is_reused_until_membership_or_content_changes() -> None:
    view = ClusterView()
    view.on_advert(advert("a"), 0.0)
    view.on_advert(advert("b"), 0.0)
    first = view.snapshot(0.1)
    view.on_advert(advert("a", seq=5), 0.2)  # same content, newer sequence
    assert view.snapshot(0.2) is first
    view.on_advert(advert("a", gflops=99.0, seq=6), 0.3)  # content changed
    second = view.snapshot(0.3)
    assert second is not first
    assert {d.id: d.speed for d in second[0].devices}["a:cpu0"] == 99.0
    # "b" falls silent (3 misses of 0.5 s): it leaves the snapshot
    view.on_advert(advert("a", gflops=99.0, seq=7), 2.0)
    assert [d.id for d in view.snapshot(2.0)[0].devices] == ["a:cpu0"]


def test_device_specs_follow_the_snapshot() -> None:
    view = ClusterView(salt="orch-1")
    for aid in ("a", "b"):
        view.on_advert(advert(aid), 0.0)
    cluster, _ = view.snapshot(0.1)
    specs = view.device_specs(cluster)
    assert specs == {d.id: view.device_spec(d.id)[1] for d in cluster.devices}
    assert view.device_specs(view.snapshot(0.2)[0]) is specs  # same snapshot: made once
    view.on_advert(advert("a", gflops=99.0, seq=6), 0.3)
    again = view.device_specs(view.snapshot(0.3)[0])
    assert again is not specs and again["a:cpu0"].gflops == 99.0
    # a cluster that is not the view's current snapshot is answered too, just not cached
    assert view.device_specs(cluster)["a:cpu0"].gflops == 99.0


def test_replicas_order_devices_differently_but_see_the_same_ones() -> None:
    views = [ClusterView(salt=s) for s in ("orch-1", "orch-2")]
    for v in views:
        for i in range(12):
            v.on_advert(advert(f"a{i}"), 0.0)
    orders = [[d.id for d in v.snapshot(0.0)[0].devices] for v in views]
    assert sorted(orders[0]) == sorted(orders[1])
    assert orders[0] != orders[1]


def test_reservations_become_slot_busy_windows() -> None:
    view = ClusterView()
    view.on_advert(advert("a"), 0.0)
    cluster, _ = view.snapshot(0.0)

    def w(
        task: str, start: float, end: float, expires: float, pipe: str = "other", slot: int = 0
    ) -> BookingWindow:
        return BookingWindow(
            pipeline_id=pipe, task_id=task, slot=slot, start=start, end=end, expires=expires
        )

    book = DeviceBookings(device="dev.a.cpu0", windows=[
        w("future", 110.0, 112.0, 999.0),
        w("overdue", 95.0, 96.0, 999.0, slot=1),  # planned end passed, not released: still busy
        w("dead", 100.0, 200.0, 99.0),  # expired: ignored
        w("mine", 100.0, 150.0, 999.0, pipe="me"),
        w("held", 120.0, 125.0, 999.0, pipe="me", slot=1),
    ])  # fmt: skip
    out = with_bookings(
        cluster,
        {"dev.a.cpu0": Cached(7, book)},
        t0=100.0,
        blocks=Blocking("me"),
        now=100.0,
    )
    busy = sorted(out.devices[0].slot_busy)
    assert busy == [(0, 10.0, 12.0), (1, 0.0, 1.0)]
    # a plan that leaves "held" where it is (a re-placement of some other task) goes around
    # its window: the write keeps it and would refuse anything through it
    out = with_bookings(
        cluster,
        {"dev.a.cpu0": Cached(7, book)},
        t0=100.0,
        blocks=Blocking("me", kept=frozenset({"held"})),
        now=100.0,
    )
    assert sorted(out.devices[0].slot_busy) == [(0, 10.0, 12.0), (1, 0.0, 1.0), (1, 20.0, 25.0)]


def test_planning_on_an_empty_fleet_says_so() -> None:
    from orchestrator.placement.planning import plan_pipeline
    from orchestrator.scheduling import Unschedulable
    from schemas import PipelineSpec

    spec = PipelineSpec.model_validate(
        {"name": "p", "tasks": [{"id": "a", "run": {"kind": "synthetic", "seconds": 0.1}}]}
    )
    with pytest.raises(Unschedulable) as err:
        plan_pipeline(spec, ClusterView(3), now=0.0)
    assert "the cluster has no devices" in str(err.value)


_window = st.tuples(
    st.sampled_from(["me", "other", "third"]),  # pipeline
    st.integers(0, 2),  # slot (the device has 2)
    st.floats(90.0, 130.0),  # start
    st.floats(0.0, 20.0),  # duration
    st.floats(95.0, 140.0),  # expires
    st.booleans(),  # preemptible
    st.integers(0, 20),  # priority
    st.floats(0.0, 120.0),  # submitted
)


_Raw = tuple[str, int, float, float, float, bool, int, float]


def _one_device_booked(raw: list[_Raw]) -> tuple[Cluster, list[BookingWindow]]:
    """A one-device cluster ("a:cpu0", 2 slots) and the windows `raw` draws for it."""
    view = ClusterView()
    view.on_advert(advert("a"), 0.0)
    cluster, _ = view.snapshot(0.0)
    windows = [
        BookingWindow(pipeline_id=p, task_id=f"t{i}", slot=k, start=s, end=s + d, expires=x,
                      preemptible=pre, priority=prio, submitted=sub)
        for i, (p, k, s, d, x, pre, prio, sub) in enumerate(raw)
    ]  # fmt: skip
    return cluster, windows


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_window, max_size=12),
    st.none() | st.floats(0.0, 40.0),
    st.floats(95.0, 125.0),
    st.frozensets(st.sampled_from([f"t{i}" for i in range(12)])),
)
def test_overlay_keeps_exactly_the_windows_in_the_way(
    raw: list[_Raw],
    eff: float | None,
    now: float,
    kept: frozenset[str],
) -> None:
    """The overlay (plain tuples, the rule inlined) equals the rule applied window by window."""
    cluster, windows = _one_device_booked(raw)
    blocks, t0 = Blocking("me", eff, now, kept), 100.0
    out = with_bookings(
        cluster, {"dev.a.cpu0": Cached(3, DeviceBookings(device="dev.a.cpu0", windows=windows))},
        t0, blocks, now,
    )  # fmt: skip
    want = sorted(
        (w.slot, s, max(s, max(w.end, now + (w.end - w.start)) - t0))
        for w in windows
        if w.expires > now and w.slot < 2 and blocks(w)
        for s in (max(0.0, w.start - t0),)
    )  # `now` may be before t0 (a wall clock stepped back): such a window is empty, not bad
    assert sorted(out.devices[0].slot_busy) == want
    cluster.devices[0].with_slot_busy(out.devices[0].slot_busy)  # what the check would pass


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_window, max_size=12),
    st.none() | st.floats(0.0, 40.0),
    st.floats(95.0, 125.0),
    st.frozensets(st.sampled_from([f"t{i}" for i in range(12)])),
    st.integers(0, 1),
    st.floats(0.0, 40.0),
    st.floats(0.01, 10.0),
)
def test_a_window_the_plan_finds_free_is_one_the_write_accepts(
    raw: list[_Raw],
    eff: float | None,
    now: float,
    kept: frozenset[str],
    slot: int,
    offset: float,
    duration: float,
) -> None:
    """What planning goes around and what the CAS write refuses agree: a window placed clear
    of the overlay is booked. The write keeps the pipeline's own windows of tasks it does
    not move; a plan that ignored them lost round after round to itself (booking_stress
    seed 401: a producer placed again beside its own booked consumer)."""
    cluster, windows = _one_device_booked(raw)
    blocks, t0 = Blocking("me", eff, now, kept), 100.0
    book = DeviceBookings(device="dev.a.cpu0", windows=windows)
    out = with_bookings(cluster, {"dev.a.cpu0": Cached(3, book)}, t0, blocks, now)
    start = max(now, t0) + offset - t0  # plans start no earlier than now
    end = start + duration
    busy = [(s, e) for k, s, e in out.devices[0].slot_busy if k == slot]
    assume(all(end <= s - 1e-3 or e + 1e-3 <= start for s, e in busy))
    new = BookingWindow(
        pipeline_id="me", task_id="new", slot=slot, start=t0 + start, end=t0 + end,
        expires=now + 30.0,
    )  # fmt: skip
    mine = {w.task_id for w in windows if w.pipeline_id == "me"}
    moving = [("me", t) for t in sorted(mine - kept)]  # what the placer hands the write
    got = rules.add(book, [new], now, blocks.evictable, moving)
    assert got.ok, got.conflicts


def _naive_alive(view: ClusterView, now: float) -> list[str]:
    return sorted(
        aid
        for aid, e in view.agents.items()
        if now - e.last_seen <= e.advert.heartbeat_interval_s * view.misses and not e.draining
    )


_ops = st.lists(
    st.tuples(
        st.sampled_from(["advert", "new_life", "beat", "drain", "undrain", "dead", "wait"]),
        st.sampled_from(["a", "b", "c"]),
        st.floats(0.0, 1.0),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ops)
def test_the_cached_live_set_is_what_a_fresh_scan_says(ops: list[tuple[str, str, float]]) -> None:
    """Every plan reads the live set; it is kept between changes, never past one."""
    from schemas import Heartbeat

    view = ClusterView(salt="orch-1")
    now, life = 0.0, {"a": 0, "b": 0, "c": 0}
    draining = {"a": False, "b": False, "c": False}
    for seq, (op, aid, dt) in enumerate(ops, start=1):
        inc = f"i{life[aid]}"
        if op == "wait":
            now += dt  # heartbeats every 0.5 s, 3 misses: gone after 1.5 s of silence
        elif op in ("advert", "new_life"):
            if op == "new_life":
                life[aid] += 1
                inc = f"i{life[aid]}"
            view.on_advert(advert(aid).model_copy(update={"incarnation": inc, "seq": seq}), now)
        elif op in ("beat", "drain", "undrain"):
            if op != "beat":
                draining[aid] = op == "drain"
            hb = Heartbeat(agent_id=aid, incarnation=inc, seq=seq, draining=draining[aid])
            view.on_heartbeat(hb, now)
        else:
            view.mark_dead(aid, inc)
        want = _naive_alive(view, now)
        assert [e.advert.agent_id for e in view.alive(now)] == want
        cluster, _ = view.snapshot(now)
        assert sorted(d.agent_id for d in cluster.devices) == want
