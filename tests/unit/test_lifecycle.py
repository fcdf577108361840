"""A pipeline's life driven through its state machine alone: stimuli in, effects out, no
server and no clock but the one each step is given."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import Placement
from orchestrator.state import lifecycle as lc
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec, TaskEvent

TOKENS = {"a": 10, "b": 11, "c": 12}


def spec() -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "p",
            "tasks": [
                {"id": "a", "run": {"kind": "synthetic"}},
                {"id": "b", "run": {"kind": "synthetic"}, "deps": ["a"]},
                {"id": "c", "run": {"kind": "synthetic"}, "deps": ["a"]},
            ],
        }
    )


def bound(tokens: dict[str, int] = TOKENS, agent: str = "ag") -> lc.Bound:
    placements = {
        t: Placement(t, f"{agent}:cpu0", 0, float(i), float(i) + 1.0)
        for i, t in enumerate(sorted(tokens))
    }
    tasks = {
        t: lc.BoundTask(agent, "cpu0", tok, predicted_s=1.0, base_s=None)
        for t, tok in tokens.items()
    }
    return lc.Bound(placements, [], "heft", tasks)


def running() -> PipelineRun:
    r = PipelineRun("p1", spec(), submitted_at=0.0)
    assert lc.step(r, lc.Placing(), 0.1) == []
    assert state(r) == "placing"
    assert lc.step(r, bound(), 0.2) == []
    effects = lc.step(r, lc.Committed(), 1.0)
    assert effects == [lc.CommitTasks(frozenset("abc")), lc.Publish(), lc.Record()]
    assert state(r) == "running" and r.committed_at == 1.0
    return r


def ev(
    eid: str,
    task: str,
    state: str,
    token: int | None = None,
    agent: str = "ag",
    inputs: dict[str, int] | None = None,
) -> TaskEvent:
    return TaskEvent.model_validate(
        dict(
            event_id=eid, pipeline_id="p1", task_id=task, agent_id=agent, incarnation="i",
            device_id="cpu0", token=TOKENS[task] if token is None else token, state=state,
            duration_s=0.5, input_tokens=inputs,
        )
    )  # fmt: skip


def state(r: PipelineRun) -> str:
    """Read afresh (a step changes it behind mypy's narrowing)."""
    return r.state


def kinds(effects: list[lc.Effect]) -> list[str]:
    return [type(e).__name__ for e in effects]


def test_bound_sets_where_each_task_runs_and_its_token() -> None:
    r = running()
    assert {t: (tr.agent_id, tr.token, tr.state) for t, tr in r.tasks.items()} == {
        "a": ("ag", 10, "accepted"), "b": ("ag", 11, "accepted"), "c": ("ag", 12, "accepted"),
    }  # fmt: skip
    assert r.algorithm == "heft" and r.planned_makespan_s == 3.0
    assert set(r.placements) == {"a", "b", "c"}


def test_a_run_to_success_says_what_to_do_at_each_event() -> None:
    r = running()
    started = ev("e1", "a", "started")
    assert lc.step(r, lc.Heard(started), 1.5) == [lc.HoldStarted("a", 10), lc.Changed()]
    a_done = ev("e2", "a", "succeeded")
    assert lc.step(r, lc.Heard(a_done), 2.0) == [
        lc.GiveBack("a"), lc.CommitResult(a_done), lc.Learn(a_done), lc.ProducerEnded("a"),
        lc.Progress(), lc.Changed(),
    ]  # fmt: skip
    lc.step(r, lc.Heard(ev("e3", "b", "succeeded")), 3.0)
    c_done = ev("e4", "c", "succeeded")
    effects = lc.step(r, lc.Heard(c_done), 4.0)
    assert kinds(effects) == [
        "CommitResult", "SettleResults", "Learn", "ProducerEnded", "Close", "Changed"
    ]  # fmt: skip
    assert r.state == "succeeded" and r.finished_at == 4.0


def test_a_duplicate_or_an_old_placements_event_changes_nothing() -> None:
    r = running()
    done = ev("e1", "a", "succeeded")
    lc.step(r, lc.Heard(done), 2.0)
    assert lc.step(r, lc.Heard(done), 2.1) == [lc.GiveBack("a"), lc.Progress(), lc.Changed()]
    old = ev("e2", "b", "succeeded", token=7)
    assert lc.step(r, lc.Heard(old), 2.2) == [lc.GiveBack("b"), lc.Progress(), lc.Changed()]
    assert r.tasks["b"].state == "accepted"
    assert (r.duplicate_events, r.stale_events) == (1, 1)


def test_a_failed_task_fails_the_pipeline_and_stops_the_rest() -> None:
    r = running()
    effects = lc.step(r, lc.Heard(ev("e1", "b", "failed")), 2.0)
    assert effects[-3:] == [lc.CancelOnAgents(r.reason), lc.Close(), lc.Changed()]
    assert lc.SettleResults() in effects
    assert r.state == "failed" and "b failed on ag" in r.reason
    assert {t: tr.state for t, tr in r.tasks.items()} == {
        "a": "cancelled", "b": "failed", "c": "cancelled",
    }  # fmt: skip


def test_a_task_its_agent_gave_up_is_placed_again() -> None:
    r = running()
    effects = lc.step(r, lc.Heard(ev("e1", "a", "cancelled")), 2.0)
    assert effects[:2] == [
        lc.GiveBack("a"), lc.RunAgain("a", "ag cancelled a itself (no reason)")
    ]  # fmt: skip
    assert r.state == "running"


def test_a_success_on_a_superseded_input_is_voided_and_run_again() -> None:
    r = running()
    lc.step(r, lc.Heard(ev("e1", "a", "succeeded")), 2.0)
    stale_input = ev("e2", "b", "succeeded", inputs={"a": 9})  # a's run under token 9
    assert lc.step(r, lc.Heard(stale_input), 2.5) == [
        lc.GiveBack("b"), lc.RunAgain("b", "b ran on a superseded input")
    ]  # fmt: skip
    assert r.tasks["b"].state == "cancelled" and r.results_voided == 1
    current = ev("e3", "c", "succeeded", inputs={"a": 10})
    assert lc.CommitResult(current) in lc.step(r, lc.Heard(current), 2.6)


def test_cancel_ends_once_and_tells_the_agents() -> None:
    r = running()
    assert lc.step(r, lc.CancelAsked(""), 2.0) == [
        lc.CancelOnAgents("cancelled by request"), lc.Close(), lc.Changed()
    ]  # fmt: skip
    assert r.state == "cancelled"
    assert lc.step(r, lc.CancelAsked("again"), 2.1) == []
    assert lc.step(r, lc.GaveUp("too late"), 2.2) == []
    assert r.reason == "cancelled by request"


def test_not_placed_ends_the_pipeline_as_unschedulable() -> None:
    r = PipelineRun("p1", spec(), submitted_at=0.0)
    lc.step(r, lc.Placing("adopted"), 0.0)
    assert r.placement_log == ["adopted"]
    assert lc.step(r, lc.NotPlaced(True, "no GPU"), 0.5) == [lc.Close()]
    assert (r.state, r.reason) == ("unschedulable", "no GPU")


def test_a_detached_tasks_old_events_are_kept_and_heard_again_if_put_back() -> None:
    r = running()
    saved = {"b": (r.tasks["b"].state, r.tasks["b"].agent_id, r.tasks["b"].token)}
    lc.step(r, lc.Detached(frozenset({"b"})), 2.0)
    assert (r.tasks["b"].state, r.tasks["b"].agent_id, r.tasks["b"].token) == ("pending", None, 0)
    late = ev("e1", "b", "started")
    assert lc.step(r, lc.Heard(late), 2.1) == [lc.Changed()]  # stale while detached, kept
    assert r.parked == [late]
    effects = lc.step(r, lc.PutBack(saved, "agent gone"), 2.2)
    assert effects == [lc.HearAgain((late,))]
    assert r.tasks["b"].token == 11 and r.parked == [] and r.stale_events == 0
    assert lc.step(r, lc.Heard(late), 2.3) == [lc.HoldStarted("b", 11), lc.Changed()]


def test_a_detached_task_placed_anew_forgets_its_old_events() -> None:
    r = running()
    lc.step(r, lc.Detached(frozenset({"b"})), 2.0)
    lc.step(r, lc.Heard(ev("e1", "b", "succeeded")), 2.1)
    lc.step(r, bound({"b": 21}, agent="other"), 2.2)
    assert lc.step(r, lc.Replaced(frozenset({"b"})), 2.3) == []
    assert r.parked == [] and r.detached == {}
    assert (r.tasks["b"].agent_id, r.tasks["b"].token) == ("other", 21)


def test_put_back_when_every_task_succeeded_meanwhile_ends_the_pipeline() -> None:
    r = running()
    lc.step(r, lc.Heard(ev("e1", "a", "succeeded")), 2.0)
    lc.step(r, lc.Heard(ev("e2", "b", "succeeded")), 2.1)
    saved = {"a": (r.tasks["a"].state, r.tasks["a"].agent_id, r.tasks["a"].token)}
    lc.step(r, lc.Detached(frozenset({"a"})), 2.2)  # its output lost: to run again
    # what waited for it got its input after all, and ends; nothing ends the pipeline yet
    assert lc.Close() not in lc.step(r, lc.Heard(ev("e3", "c", "succeeded")), 2.3)
    assert state(r) == "running"
    assert lc.step(r, lc.PutBack(saved, "outputs lost"), 3.0) == [lc.Close()]
    assert r.state == "succeeded"
    assert "nothing to re-run" in r.placement_log[-1]


EVENT_STATES = ["accepted", "started", "succeeded", "failed", "cancelled"]
events = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(EVENT_STATES),
        st.sampled_from([0, 1]),  # 0: the current token; 1: an older placement's
        st.integers(0, 5),  # event id: repeats are duplicates (or replays)
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(events)
def test_any_stream_of_events_ends_at_most_once_and_commits_each_result_once(
    stream: list[tuple[str, str, int, int]],
) -> None:
    r = running()
    closes, results, ended_as = 0, [], None
    for n, (task, state, old, eid) in enumerate(stream):
        token = TOKENS[task] - old
        effects = lc.step(r, lc.Heard(ev(f"{task}{state}{old}{eid}", task, state, token)), n)
        closes += effects.count(lc.Close())
        results += [(e.ev.task_id, e.ev.token) for e in effects if isinstance(e, lc.CommitResult)]
        assert all(
            e.ev.token == TOKENS[e.ev.task_id] for e in effects if isinstance(e, lc.CommitResult)
        )
        if ended_as is not None:
            assert r.state == ended_as  # an end is never undone
            assert not any(isinstance(e, (lc.CommitResult, lc.RunAgain, lc.Learn)) for e in effects)
        elif r.terminal:
            ended_as = r.state
            assert lc.Close() in effects
    assert closes == (1 if r.terminal else 0)
    assert len(results) == len(set(results))


def test_an_agent_lost_re_places_only_pipelines_it_ran_or_holds_outputs_of() -> None:
    r = running()
    lost = lc.AgentLost("ag", "inc-1", "heartbeats missed")
    assert lc.step(r, lost, 2.0) == [
        lc.RePlace(frozenset({"ag"}), {"ag": "inc-1"}, "agent ag dead (heartbeats missed)")
    ]
    assert lc.step(r, lc.AgentLost("elsewhere", "i", "gone"), 2.0) == []
    lc.step(r, lc.CancelAsked("done"), 2.1)
    assert lc.step(r, lost, 2.2) == []  # ended: nothing to re-place


def test_a_lease_lost_passes_on_a_cancel_its_new_owner_has_not_heard() -> None:
    r = running()
    assert lc.step(r, lc.LeaseLost("o1", "adopted by o2", end_recorded=False), 2.0) == []
    assert r.placement_log[-1] == "o1 lost the ownership lease (adopted by o2)"
    lc.step(r, lc.CancelAsked(""), 2.1)  # while the lease had lapsed
    assert lc.step(r, lc.LeaseLost("o1", "x", end_recorded=False), 2.2) == [lc.PassCancel()]
    assert lc.step(r, lc.LeaseLost("o1", "x", end_recorded=True), 2.3) == []
