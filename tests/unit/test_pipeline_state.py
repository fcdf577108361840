"""The orchestrator's pipeline state machine: events apply once, under the current token."""

from __future__ import annotations

from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec, TaskEvent


def run() -> PipelineRun:
    spec = PipelineSpec.model_validate(
        {
            "name": "p",
            "tasks": [
                {"id": "a", "run": {"kind": "synthetic"}},
                {"id": "b", "run": {"kind": "synthetic"}, "deps": ["a"]},
            ],
        }
    )
    r = PipelineRun("p1", spec, submitted_at=0.0)
    for tid, tok in (("a", 10), ("b", 11)):
        t = r.tasks[tid]
        t.agent_id, t.device_id, t.token, t.state = "ag", "cpu0", tok, "accepted"
    r.state, r.committed_at = "running", 1.0
    return r


def ev(eid: str, task: str, state: str, token: int, agent: str = "ag") -> TaskEvent:
    return TaskEvent.model_validate(
        dict(
            event_id=eid,
            pipeline_id="p1",
            task_id=task,
            agent_id=agent,
            incarnation="i",
            device_id="cpu0",
            token=token,
            state=state,
            duration_s=0.5,
        )
    )


def test_success_after_all_tasks_and_duplicates_ignored() -> None:
    r = run()
    assert r.apply(ev("e1", "a", "started", 10), 1.5) is None
    assert r.apply(ev("e2", "a", "succeeded", 10), 2.0) is None
    assert r.apply(ev("e2", "a", "succeeded", 10), 2.0) is None
    assert r.duplicate_events == 1
    assert r.apply(ev("e3", "b", "succeeded", 11), 3.0) == "succeeded"
    st = r.status(4.0)
    assert st.state == "succeeded" and st.elapsed_s == 2.0
    # a start is dated by how long the task says it had run (each event here: 0.5 s); b's
    # only event is its end (a short task's start is not reported on its own)
    assert [t.started_s for t in st.tasks] == [0.0, 1.5]


def test_stale_token_or_wrong_agent_is_ignored() -> None:
    r = run()
    assert r.apply(ev("e1", "a", "failed", 9), 2.0) is None
    assert r.apply(ev("e2", "a", "failed", 10, agent="other"), 2.0) is None
    assert r.stale_events == 2 and r.state == "running"
    assert r.apply(ev("e3", "a", "failed", 10), 2.0) == "failed"
    assert "task a failed" in r.reason


def test_a_detached_placements_events_are_stale_and_kept_once() -> None:
    """While a re-placement has taken b (token 0), events of b's old placement are stale and
    kept, once each; events of any other placement are stale and not kept."""
    r = run()
    r.detached["b"] = ("ag", 11)
    t = r.tasks["b"]
    t.state, t.agent_id, t.token = "pending", None, 0
    old_end = ev("e1", "b", "succeeded", 11)
    assert r.apply(old_end, 2.0) is None
    assert r.apply(old_end, 2.0) is None  # delivered twice: kept once
    assert r.apply(ev("e2", "b", "succeeded", 9), 2.0) is None  # an older placement's
    assert r.apply(ev("e3", "b", "succeeded", 11, agent="other"), 2.0) is None
    assert r.parked == [old_end] and r.stale_events == 4 and t.state == "pending"


def test_settle_ends_a_pipeline_only_once_every_task_succeeded() -> None:
    """Task states put back outside `apply` (a failed re-placement's restore) end the
    pipeline by the same rule."""
    r = run()
    r.tasks["a"].state = "succeeded"
    assert not r.settle(2.0) and not r.terminal
    r.tasks["b"].state = "succeeded"
    assert r.settle(3.0) and r.status(3.0).state == "succeeded" and r.finished_at == 3.0
    assert not r.settle(4.0) and r.finished_at == 3.0  # ended once


def test_a_task_is_stalled_only_when_free_to_start_for_long() -> None:
    r = run()  # committed at 1.0; a has no inputs, b needs a
    assert r.stalled(now=1.0 + 5.0, after_s=10.0) == []
    assert r.stalled(now=1.0 + 10.5, after_s=10.0) == ["a"]  # b waits for a: not stalled
    r.apply(ev("e1", "a", "started", 10), now=12.0)
    assert r.stalled(now=12.0, after_s=10.0) == []
    r.apply(ev("e2", "a", "succeeded", 10), now=13.0)  # b free from 12 s on its clock
    assert r.stalled(now=13.0 + 9.0, after_s=10.0) == []
    assert r.stalled(now=13.0 + 10.5, after_s=10.0) == ["b"]
    r.apply(ev("e3", "b", "succeeded", 11), now=24.0)
    assert r.terminal and r.stalled(now=100.0, after_s=10.0) == []


def test_a_task_queued_behind_others_is_not_stalled_before_its_planned_start() -> None:
    from orchestrator.scheduling import Placement

    r = run()
    r.placements = {"a": Placement("a", "ag:cpu0", 0, 30.0, 31.0)}  # queued: starts at 30 s
    assert r.stalled(now=1.0 + 35.0, after_s=10.0) == []
    assert r.stalled(now=1.0 + 40.5, after_s=10.0) == ["a"]


def test_a_started_task_is_overdue_only_far_past_its_prediction() -> None:
    r = run()
    r.tasks["a"].predicted_s = 4.0
    r.apply(ev("e1", "a", "started", 10), now=2.0)  # started at 1 s on the run's clock
    assert r.overdue(now=1.0 + 1.0 + 10.0 + 3 * 4.0 - 0.5, after_s=10.0, factor=3.0) == []
    assert r.overdue(now=1.0 + 1.0 + 10.0 + 3 * 4.0 + 0.5, after_s=10.0, factor=3.0) == ["a"]
    r.apply(ev("e2", "a", "succeeded", 10), now=30.0)
    assert r.overdue(now=100.0, after_s=10.0, factor=3.0) == []


def test_a_result_on_a_superseded_producer_run_is_voided_not_committed() -> None:
    r = run()
    assert r.apply(ev("e1", "a", "succeeded", 10), 2.0) is None
    good = ev("e2", "b", "succeeded", 11).model_copy(update={"input_tokens": {"a": 10}})
    assert r.superseded_inputs(good) == {}
    # a was placed again (token 12) before its first run's end was heard: that run is not a
    # committed one, and a result on its output is refused
    r2 = run()
    r2.tasks["a"].token = 12
    bad = ev("e3", "b", "succeeded", 11).model_copy(update={"input_tokens": {"a": 10}})
    assert r2.superseded_inputs(bad) == {"a": 10}
    assert r2.void(bad, {"a": 10}, 3.0)
    assert r2.tasks["b"].state == "cancelled" and "superseded output of a" in r2.tasks["b"].error
    assert r2.results_voided == 1 and r2.state == "running"
    assert not r2.void(bad, {"a": 10}, 3.0)  # the same event again: once
    assert r2.apply(bad, 3.0) is None and r2.tasks["b"].state == "cancelled"
    # the current placement's output before its end is heard: not superseded
    now = ev("e4", "b", "succeeded", 11).model_copy(update={"input_tokens": {"a": 12}})
    assert r2.superseded_inputs(now) == {}
    # an agent of an older release says nothing: nothing to judge by
    assert r2.superseded_inputs(ev("e5", "b", "succeeded", 11)) == {}
    # a missing input token (0) is never a committed run
    none = ev("e6", "b", "succeeded", 11).model_copy(update={"input_tokens": {}})
    assert r2.superseded_inputs(none) == {"a": 0}


def test_a_consumer_is_never_shown_starting_before_its_producer_ended() -> None:
    """Events are heard late by each agent's link: b's start (heard at 2.1, 0.5 s into its
    run) dates before a's end (heard at 2.0); a's end is dated back to b's start."""
    r = run()
    assert r.apply(ev("e1", "a", "succeeded", 10), 3.0) is None  # heard late: clock 2.0
    r.apply(ev("e2", "b", "started", 11), 3.1)  # clock 2.1, ran 0.5 s: began at 1.6
    a, b = r.tasks["a"], r.tasks["b"]
    assert b.started_s is not None and abs(b.started_s - 1.6) < 1e-9
    assert a.finished_s is not None and a.finished_s <= b.started_s
    assert a.started_s is not None and a.started_s <= a.finished_s
    # the other order of hearing: the consumer first, the producer's end after
    r2 = run()
    r2.apply(ev("e2", "b", "started", 11), 3.1)
    r2.apply(ev("e1", "a", "succeeded", 10), 3.5)
    assert r2.tasks["a"].finished_s <= r2.tasks["b"].started_s  # type: ignore[operator]


def test_tasks_of_a_pipeline_that_failed_or_was_cancelled_end_cancelled() -> None:
    r = run()
    r.apply(ev("e1", "a", "started", 10), 1.5)
    r.finish("cancelled", "cancelled by the user", 2.0)
    assert [t.state for t in r.status(2.0).tasks] == ["cancelled", "cancelled"]
    r2 = run()
    assert r2.apply(ev("e1", "a", "failed", 10), 2.0) == "failed"
    assert [t.state for t in r2.status(2.0).tasks] == ["failed", "cancelled"]


def test_an_end_heard_before_applies_again_to_a_task_put_back_under_its_placement() -> None:
    """A re-placement that failed put the task back as it was before its end was heard: the
    end, heard again (read again from the stream), ends it; under another token it does not."""
    r = run()
    end = ev("e1", "a", "succeeded", 10)
    r.apply(end, 2.0)
    r.tasks["a"].state = "accepted"  # put back
    r.apply(end, 2.5)
    assert r.status(2.5).tasks[0].state == "succeeded" and r.duplicate_events == 0
    r.apply(end, 2.6)
    assert r.duplicate_events == 1  # ended now: a plain duplicate
    r.tasks["a"].state, r.tasks["a"].token = "accepted", 12  # placed again since
    r.apply(end, 2.7)
    assert r.tasks["a"].state == "accepted" and r.duplicate_events == 2
