"""Pure pieces of the placement loop: aging and the set of tasks a change affects."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.placement.placer import MIN_WINDOW_S, ancestors, descendants, window_ends
from orchestrator.reservations.book import (
    AGING_PER_S,
    EVICTION_POINTS,
    Blocking,
    effective_priority,
)
from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec
from schemas.bookings import BookingWindow


def test_aging_lets_a_long_waiting_low_priority_pipeline_outrank_a_new_high_one() -> None:
    now = 1000.0
    old_low = effective_priority(10, submitted=now - 600 / AGING_PER_S, now=now)
    new_high = effective_priority(500, submitted=now, now=now)
    assert old_low > new_high
    assert effective_priority(10, submitted=now + 5, now=now) == 10  # no negative age


def test_only_preemptible_lower_priority_windows_are_evictable() -> None:
    def win(prio: int, preemptible: bool) -> BookingWindow:
        return BookingWindow(
            pipeline_id="p",
            task_id="t",
            slot=0,
            start=0,
            end=1,
            expires=9,
            priority=prio,
            preemptible=preemptible,
            submitted=100.0,
        )

    assert Blocking(eff=500, now=100.0).evictable(win(10, True))
    assert not Blocking(eff=500, now=100.0).evictable(win(10, False))
    assert not Blocking(eff=500, now=100.0).evictable(win(600, True))
    # aged: the same low-priority window, waiting long enough, is no longer evictable
    assert not Blocking(eff=500, now=100.0 + 1000 / AGING_PER_S).evictable(win(10, True))
    # what a plan works around: all but its own pipeline's and what it may evict
    blocks = Blocking("me", eff=500, now=100.0)
    assert not blocks(win(10, True))
    assert blocks(win(10, False)) and blocks(win(600, True))
    mine = win(600, False).model_copy(update={"pipeline_id": "me"})
    assert not blocks(mine)
    assert Blocking("me")(win(10, True))  # evicting nothing, it is in the way


@settings(max_examples=200, deadline=None)
@given(
    low=st.integers(0, 1000), high=st.integers(0, 1000), age=st.floats(0.0, 1e4),
)  # fmt: skip
def test_a_task_is_evicted_at_most_once_per_eviction_points_of_the_gap(
    low: int, high: int, age: float
) -> None:
    """However long it has waited, a preemptible task's window is taken by work `high` at
    most ceil((high - low) / EVICTION_POINTS) times: each eviction is booked into its next
    window, which ranks that much higher."""
    now = 1e6
    blocks = Blocking(eff=effective_priority(high, submitted=now, now=now), now=now)
    times = 0
    for evictions in range(1001):
        w = BookingWindow(
            pipeline_id="p", task_id="t", slot=0, start=0, end=1, expires=9e9,
            priority=low, preemptible=True, submitted=now - age, evictions=evictions,
        )  # fmt: skip
        if not blocks.evictable(w):
            break
        times += 1
    assert times <= max(0, math.ceil((high - low) / EVICTION_POINTS))
    assert (times > 0) == (low + AGING_PER_S * age < high)  # the first one as before


def test_descendants_and_ancestors_follow_dependencies_one_way() -> None:
    spec = PipelineSpec.model_validate({"name": "d", "tasks": [
        {"id": "a", "run": {"kind": "synthetic"}},
        {"id": "b", "run": {"kind": "synthetic"}, "deps": ["a"]},
        {"id": "c", "run": {"kind": "synthetic"}, "deps": ["b"]},
        {"id": "x", "run": {"kind": "synthetic"}},
    ]})  # fmt: skip
    run = PipelineRun("p", spec, submitted_at=0.0)
    assert descendants(run, {"b"}) == {"b", "c"}
    assert descendants(run, {"a"}) == {"a", "b", "c"}
    assert descendants(run, {"x"}) == {"x"}
    assert ancestors(run, {"c"}) == {"a", "b"}  # the roots themselves left out
    assert ancestors(run, {"b", "c"}) == {"a"}
    assert ancestors(run, {"a", "x"}) == set()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 5e-3), min_size=1, max_size=12), st.lists(st.booleans()))
def test_reserved_windows_are_stretched_but_never_overlap_on_a_slot(
    durations: list[float], gaps: list[bool]
) -> None:
    """Back-to-back short tasks on one slot: each window reaches MIN_WINDOW_S where there is
    room, covers its planned run, and never runs into the next task's window."""
    placements: dict[str, Placement] = {}
    t = 0.0
    for i, dur in enumerate(durations):
        placements[f"t{i}"] = Placement(f"t{i}", "a:cpu0", 0, t, t + dur)
        t += dur + (2e-3 if i < len(gaps) and gaps[i] else 0.0)
    ends = window_ends(placements, placements)
    spans = [(p.start, ends[p.task_id]) for p in placements.values()]
    for a, (s0, e0) in enumerate(spans):
        for s1, e1 in spans[a + 1 :]:
            assert min(e0, e1) - max(s0, s1) <= 0.0  # no two windows share any time
    for p in placements.values():
        end = ends[p.task_id]
        assert end >= p.finish
        room = min(
            (q.start for q in placements.values() if q is not p and q.start >= p.finish),
            default=math.inf,
        )
        assert end >= min(p.start + MIN_WINDOW_S, room)
