"""booking_stress's check over placement logs: a window its owner made firm is never evicted."""

from __future__ import annotations

from benchmarks.booking_stress import (
    Outcome,
    cancelled_as_asked,
    evictions_per_task,
    held_then_evicted,
    timeline,
)
from schemas.api import StatusReply, TaskStatus


def status(*log: str, pid: str = "p") -> StatusReply:
    return StatusReply(pipeline_id=pid, name=pid, state="succeeded", placement_log=list(log))


HELD = "t1 started: its window on dev.a.cpu0 is no longer preemptible"


def test_an_eviction_of_a_held_window_is_counted_and_nothing_else() -> None:
    taken = "evicted from dev.a.cpu0: t0, t1 (preempted by higher-priority hi)"
    bad = status(HELD, taken)
    assert held_then_evicted([bad]) == [bad]
    assert held_then_evicted([status(taken, HELD)]) == []  # evicted before it started
    other_key = "evicted from dev.b.cpu0: t1 (preempted by higher-priority hi)"
    other_task = "evicted from dev.a.cpu0: t0 (preempted by higher-priority hi)"
    assert held_then_evicted([status(HELD, other_key, other_task), None]) == []
    # per pipeline: another pipeline's held task of the same name is not this one's
    assert held_then_evicted([status(HELD), status(taken)]) == []
    # run again since (a new placement, a new window): that one may be taken
    again = "b: input t1 of t2 is gone from a: re-running t1 (outputs lost); t2 booked again after"
    assert held_then_evicted([status(HELD, again, taken)]) == []
    # a notice about another window of the task: the owner finds this one still there
    still = "t1 still booked on dev.a.cpu0: not moved"
    assert held_then_evicted([status(HELD, taken, still)]) == []
    assert held_then_evicted([status(HELD, taken, "re-placed after eviction: t0")]) == [
        status(HELD, taken, "re-placed after eviction: t0")
    ]


def test_evictions_are_counted_per_task_and_only_those_that_took_a_window() -> None:
    a = "evicted from dev.a.cpu0: t0, t1 (preempted by higher-priority hi)"
    b = "evicted from dev.b.cpu0: t1 (preempted by higher-priority hi)"
    still = "t1 still booked on dev.a.cpu0: not moved"
    stale = "evicted windows of t0 were stale: not placed there now"
    moved = "re-placed after eviction: t1"
    logs = [
        status(a, "round 0: conflict on dev.c.cpu0 with x/t2; re-planning", still, b, moved),
        status(a, stale, b, pid="q"),
        None,
    ]
    assert evictions_per_task(logs) == {("p", "t0"): 1, ("p", "t1"): 1, ("q", "t1"): 2}


def test_the_slowest_pipelines_timeline_says_when_each_task_ran() -> None:
    st = StatusReply(
        pipeline_id="p",
        name="p",
        state="succeeded",
        elapsed_s=31.5,
        tasks=[
            TaskStatus(
                task_id="t0", state="succeeded", agent_id="a", started_s=0.0, finished_s=0.1
            ),
            TaskStatus(task_id="t1", state="pending", agent_id="b"),
        ],
    )
    assert timeline(st) == (
        "  its owner's account: 31.50 s elapsed; tasks (start-end, s): "
        "t0@a 0.00-0.10; t1@b not started (pending)"
    )


def test_a_cancelled_pipeline_must_end_as_its_cancel_was_answered() -> None:
    def out(cancel: str, state: str) -> Outcome:
        return Outcome("p", 1, state, cancel=cancel)

    assert cancelled_as_asked(out("cancelled", "cancelled"))
    assert cancelled_as_asked(out("succeeded", "succeeded"))  # it had ended before the cancel
    assert not cancelled_as_asked(out("cancelled", "succeeded"))  # told cancelled, ran on
    assert not cancelled_as_asked(out("refused not_found: no pipeline p", "succeeded"))
    assert not cancelled_as_asked(out("failed", "failed"))  # a failure, whatever it was told
    assert not cancelled_as_asked(out("", "succeeded"))  # never cancelled: judged as the rest
