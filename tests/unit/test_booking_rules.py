"""The pure rules of one device's reservation key."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.booking_ops import release_one, renew_one
from orchestrator.reservations import book
from schemas.bookings import BookingWindow, DeviceBookings


def w(
    task: str,
    start: float,
    end: float,
    *,
    slot: int = 0,
    pipe: str = "p",
    expires: float = 1e9,
    prio: int = 100,
    preemptible: bool = False,
) -> BookingWindow:
    return BookingWindow(
        pipeline_id=pipe,
        task_id=task,
        slot=slot,
        start=start,
        end=end,
        expires=expires,
        priority=prio,
        preemptible=preemptible,
    )


def test_overlap_on_one_slot_conflicts_other_slot_does_not() -> None:
    b = DeviceBookings(device="d", windows=[w("a", 0, 10, pipe="x")])
    assert not book.add(b, [w("b", 5, 6)], now=0).ok
    res = book.add(b, [w("b", 5, 6, slot=1)], now=0)
    assert res.ok and len(res.book.windows) == 2
    assert book.add(b, [w("c", 10, 11)], now=0).ok  # touching is not overlapping


def test_windows_of_tasks_placed_again_give_way_wherever_they_go() -> None:
    """u leaves this device in the same re-placement that puts t here at u's old time: u's
    old window is no conflict for t (it is being replaced); another task's window is."""
    b = DeviceBookings(device="d", windows=[w("u", 0, 10), w("x", 20, 30)])
    assert not book.add(b, [w("t", 5, 6)], now=0).ok  # u's window in the way
    res = book.add(b, [w("t", 5, 6)], now=0, moving=[("p", "t"), ("p", "u")])
    assert res.ok and [x.task_id for x in res.book.windows] == ["t", "x"]
    res = book.add(b, [w("t", 25, 26)], now=0, moving=[("p", "t"), ("p", "u")])
    assert not res.ok and [c.task_id for c in res.conflicts] == ["x"]  # x is not moving
    # another pipeline's task of the same name is not ours to move
    other = DeviceBookings(device="d", windows=[w("u", 0, 10, pipe="q")])
    assert not book.add(other, [w("t", 5, 6)], now=0, moving=[("p", "u")]).ok


def test_expired_windows_are_dropped_by_the_next_writer() -> None:
    b = DeviceBookings(device="d", windows=[w("a", 0, 10, pipe="dead", expires=5.0)])
    res = book.add(b, [w("b", 1, 2)], now=6.0)
    assert res.ok and res.expired == 1
    assert [x.task_id for x in res.book.windows] == ["b"]


def test_eviction_only_where_allowed() -> None:
    low = w("a", 0, 10, pipe="low", preemptible=True, prio=1)
    firm = w("b", 0, 10, pipe="firm", slot=1, prio=1)
    b = DeviceBookings(device="d", windows=[low, firm])
    res = book.add(b, [w("h", 2, 3, pipe="hi")], 0, may_evict=lambda x: x.preemptible)
    assert res.ok and res.evicted == [low]
    res = book.add(b, [w("h", 2, 3, pipe="hi", slot=1)], 0, may_evict=lambda x: x.preemptible)
    assert not res.ok and res.conflicts == [firm]


def test_a_held_window_is_no_longer_evictable_and_nothing_else_changes() -> None:
    """`hold` (a started task) makes only that placement's window firm: not another task's,
    another pipeline's, nor an older window of the same task at other times."""
    mine = w("a", 0, 10, pipe="low", preemptible=True, prio=1)
    older = w("a", 20, 30, pipe="low", preemptible=True, prio=1, slot=1)
    sibling = w("b", 10, 20, pipe="low", preemptible=True, prio=1)
    other = w("a", 0, 10, pipe="other", preemptible=True, prio=1, slot=2)
    b = DeviceBookings(device="d", windows=[mine, older, sibling, other])
    held = book.hold(b, "low", "a", 0, 10)
    assert held.windows == [mine.model_copy(update={"preemptible": False}), older, sibling, other]
    assert book.hold(held, "low", "a", 0, 10) is held  # once is enough: nothing to write
    assert book.hold(b, "low", "gone", 0, 10) is b
    res = book.add(held, [w("h", 2, 3, pipe="hi")], 0, may_evict=lambda x: x.preemptible)
    assert not res.ok and res.conflicts == [held.windows[0]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.floats(0, 50), st.floats(0.01, 10), st.integers(1, 9)),
        min_size=1, max_size=12,
    ),
    st.data(),
)  # fmt: skip
def test_no_booking_evicts_a_held_window(
    reqs: list[tuple[int, float, float, int]], data: st.DataObject
) -> None:
    """Whatever is booked after it, at any priority, a held window (a started task's) stays;
    holding changes that window's flag and nothing else."""
    b = DeviceBookings(device="d")
    for i, (slot, start, dur, prio) in enumerate(reqs):
        ask = w(f"t{i}", start, start + dur, slot=slot, pipe=f"p{i}", prio=prio, preemptible=True)

        def lower(x: BookingWindow, than: int = prio) -> bool:
            return x.preemptible and x.priority < than

        b = book.add(b, [ask], 0, may_evict=lower).book
    target = data.draw(st.sampled_from(b.windows))
    held = book.hold(b, target.pipeline_id, target.task_id, target.start, target.end)
    assert [x.model_copy(update={"preemptible": True}) for x in held.windows] == b.windows
    assert [x.preemptible for x in held.windows].count(False) == 1
    slot, start, dur = data.draw(
        st.tuples(st.integers(0, 2), st.floats(0, 50), st.floats(0.01, 10))
    )
    res = book.add(
        held, [w("h", start, start + dur, slot=slot, pipe="hi", prio=1000)], 0,
        may_evict=lambda x: x.preemptible,
    )  # fmt: skip
    kept = held.windows[[x.preemptible for x in held.windows].index(False)]
    assert kept not in res.evicted
    assert kept in res.book.windows


def test_rebooking_a_task_replaces_its_window_and_release_renew_work() -> None:
    b = book.add(DeviceBookings(device="d"), [w("a", 0, 1)], 0).book
    b = book.add(b, [w("a", 5, 6)], 0).book
    assert [(x.start, x.end) for x in b.windows] == [(5, 6)]
    b = book.renew(b, ["p"], 50.0, 0)
    assert b.windows[0].expires == 1e9  # never shortens
    b2 = book.renew(book.add(b, [w("z", 7, 8, pipe="q", expires=3)], 0).book, ["q"], 40.0, 1)
    assert {x.task_id: x.expires for x in b2.windows}["z"] == 40.0
    assert book.release(b2, [("p", 0, None, None)]).windows == [
        x for x in b2.windows if x.pipeline_id == "q"
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.floats(0, 50), st.floats(0.01, 10)), max_size=25))
def test_any_sequence_of_adds_never_double_books(reqs: list[tuple[int, float, float]]) -> None:
    b = DeviceBookings(device="d")
    for i, (slot, start, dur) in enumerate(reqs):
        res = book.add(b, [w(f"t{i}", start, start + dur, slot=slot, pipe=f"p{i}")], now=0)
        b = res.book
        assert book.double_booked(b.windows) == []


_ident = st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)


@settings(max_examples=100, deadline=None)
@given(_ident, _ident)
def test_a_scheduler_device_id_names_the_same_key(agent: str, device: str) -> None:
    from orchestrator.reservations.store import device_key, device_key_of

    assert device_key_of(f"{agent}:{device}") == device_key(agent, device)


def test_an_exact_release_gives_back_only_the_window_booked() -> None:
    b = DeviceBookings(device="d", windows=[w("a", 0, 1), w("b", 1, 2), w("a", 5, 6, pipe="q")])
    out = book.release(b, [("p", 0.0, None, {("a", 0.0, 1.0)})])
    assert [(x.pipeline_id, x.task_id) for x in out.windows] == [("p", "b"), ("q", "a")]
    # the task booked again since (another window): the stale release leaves it alone
    again = DeviceBookings(device="d", windows=[w("a", 3, 4), w("b", 1, 2)])
    assert book.release(again, [("p", 0.0, None, {("a", 0.0, 1.0)})]).windows == again.windows


_pipes = st.sampled_from(["p", "q", "r"])
_tasks = st.sampled_from(["a", "b", "c"])
_windows = st.lists(
    st.builds(
        lambda task, pipe, start, expires: w(task, start, start + 1.0, pipe=pipe, expires=expires),
        _tasks,
        _pipes,
        st.sampled_from([0.0, 1.0, 2.0]),
        st.sampled_from([5.0, 10.0, 1e9]),
    ),
    max_size=12,
)
_release = st.tuples(
    _pipes,
    st.sampled_from([0.0, 6.0, 11.0]),  # its `now`: what had expired by then goes too
    st.one_of(st.none(), st.lists(_tasks, max_size=2)),
    st.one_of(
        st.none(),
        st.lists(st.tuples(_tasks, st.sampled_from([0.0, 1.0]), st.sampled_from([1.0, 2.0]))),
    ),
)


@settings(max_examples=300)
@given(_windows, st.lists(_release, max_size=6))
def test_releases_in_one_pass_leave_what_one_at_a_time_leaves(
    windows: list[BookingWindow], releases: list[book.ReleaseArgs]
) -> None:
    b = DeviceBookings(device="d", windows=windows)
    step = b
    for r in releases:
        step = release_one(step, r)
    assert book.release(b, releases) == step


@settings(max_examples=300)
@given(_windows, st.lists(_pipes, max_size=3), st.sampled_from([0.0, 6.0, 11.0]))
def test_renewals_in_one_pass_leave_what_one_at_a_time_leaves(
    windows: list[BookingWindow], pids: list[str], now: float
) -> None:
    b = DeviceBookings(device="d", windows=windows)
    step = b
    for pid in sorted(set(pids)):
        step = renew_one(step, pid, 50.0, now)
    assert book.renew(b, set(pids), 50.0, now) == step


def test_the_booking_ops_benchmark_checks_both_ways_agree(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.booking_ops import main

    assert main(["--windows", "3,30", "--repeat", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["3", "30"]


def add_pairwise(
    b: DeviceBookings, new: list[BookingWindow], now: float, may_evict: Any
) -> book.AddResult:
    """`book.add` as the rule says it, one pair of windows at a time."""
    keys = {(x.pipeline_id, x.task_id) for x in new}
    current = book.live(b.windows, now)
    kept = [x for x in current if (x.pipeline_id, x.task_id) not in keys]
    conflicts = [x for x in kept if any(book.overlaps(x, n) for n in new) and not may_evict(x)]
    evicted = [x for x in kept if any(book.overlaps(x, n) for n in new) and may_evict(x)]
    if any(book.overlaps(x, y) for i, x in enumerate(new) for y in new[i + 1 :]):
        raise ValueError("overlap")
    expired = len(b.windows) - len(current)
    if conflicts:
        return book.AddResult(False, b, conflicts=conflicts, expired=expired)
    gone = {(x.pipeline_id, x.task_id) for x in evicted}
    windows = [x for x in kept if (x.pipeline_id, x.task_id) not in gone] + new
    windows.sort(key=lambda x: (x.slot, x.start, x.pipeline_id, x.task_id))
    out = DeviceBookings(device=b.device, windows=windows)
    return book.AddResult(True, out, evicted=evicted, expired=expired)


# starts and lengths around EPS of each other (touching, barely overlapping, shorter than EPS)
_at = st.sampled_from([0.0, 1.0, 1.0 - 2e-6, 1.0 - 1e-6, 1.0 - 5e-7, 1.0 + 5e-7, 1.0 + 1e-6, 2.5])
_len = st.sampled_from([0.0, 5e-7, 1e-6, 1.5e-6, 2e-6, 1.0, 3.0])
_window = st.builds(
    lambda task, pipe, slot, start, length, preemptible: w(
        task, start, start + length, slot=slot, pipe=pipe, preemptible=preemptible,
        expires=5.0 if task == "e" else 1e9,
    ),
    st.sampled_from(["a", "b", "c", "d", "e"]), _pipes, st.integers(0, 1), _at, _len,
    st.booleans(),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.lists(_window, max_size=10), st.lists(_window, min_size=1, max_size=8))
def test_a_booking_finds_the_overlaps_pair_by_pair_would(
    booked: list[BookingWindow], new: list[BookingWindow]
) -> None:
    """`add` looks each window up among the booking's, sorted by start, instead of at every
    pair (a 5,000-task pipeline on two devices: 6 million pairs, the event loop held over a
    second): the same conflicts, evictions and refusals as pair by pair."""
    b = DeviceBookings(device="d", windows=booked)

    def preemptible(x: BookingWindow) -> bool:
        return x.preemptible

    try:
        want: book.AddResult | None = add_pairwise(b, new, 1.0, preemptible)
    except ValueError:
        want = None
    if want is None:
        with pytest.raises(ValueError, match="overlap on slot"):
            book.add(b, new, 1.0, preemptible)
    else:
        assert book.add(b, new, 1.0, preemptible) == want
