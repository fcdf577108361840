"""The booking stress: its dataflow audit fed synthetic task events (a committed consumer run
must have run on its producers' committed runs, or a later re-run of a lost output, not
before they could have ended, and every run ends once per token), and its fleet split over
processes for the SIGSTOP fault."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from benchmarks.booking_stress import (
    Dataflow,
    Stored,
    cluster_summary,
    committed_results,
    first_copies,
    fleet_processes,
    judge_pipeline,
    main,
    run_span,
    stopped_share,
)
from schemas.events import TaskEvent, TaskEventState
from schemas.recovery import ClusterEvent, TaskResult, TaskResults

PID = "bs1-000001"
#: t0 -> t1: one producer, one consumer.
CHAIN = {"t0": (), "t1": ("t0",)}
_seq = itertools.count(1)


def stored(
    task: str,
    state: TaskEventState,
    token: int,
    ts: float,
    *,
    ran: float | None = 0.1,
    inputs: dict[str, int] | None = None,
    agent: str = "bs-0001",
    event_id: str | None = None,
) -> Stored:
    n = next(_seq)
    ev = TaskEvent(
        event_id=event_id or f"inc-{n}",
        pipeline_id=PID,
        task_id=task,
        agent_id=agent,
        incarnation="inc",
        device_id="cpu0",
        token=token,
        state=state,
        duration_s=ran,
        input_tokens=inputs if inputs is not None else ({} if state != "started" else None),
    )
    return Stored(seq=n, ts=ts, ev=ev)


def committed(*events: Stored) -> dict[str, TaskResult]:
    return {s.ev.task_id: TaskResult.of(s.ev, "orch-a") for s in events}


def test_a_consumer_on_its_producers_committed_run_after_it_ended_is_fine() -> None:
    p = stored("t0", "succeeded", 10, ts=100.10)
    c = stored("t1", "succeeded", 10, ts=100.25, inputs={"t0": 10})
    v = judge_pipeline(CHAIN, [p, c], committed(p, c), booked={10: 100.0})
    assert v.inputs == 1 and v.runs == 2
    assert not (v.superseded or v.early or v.twice or v.untokened or v.incomplete or v.reruns)
    assert v.closest_s == pytest.approx(0.05)
    assert v.margin_s == pytest.approx(0.05)


def test_a_superseded_producer_run_with_an_older_token_feeding_its_consumer_is_one() -> None:
    """SIGSTOP: P ran under token 10 on a frozen agent, was placed again under 20 and
    committed there; the frozen agent resumed and its old run fed C."""
    old = stored("t0", "succeeded", 10, ts=100.1, agent="bs0-0001")
    new = stored("t0", "succeeded", 20, ts=103.0, agent="bs1-0001")
    c = stored("t1", "succeeded", 20, ts=103.5, inputs={"t0": 10})
    v = judge_pipeline(CHAIN, [old, new, c], committed(new, c), booked={10: 100.0, 20: 102.0})
    assert v.superseded == [
        "t1 (token 20) ran on t0 under token 10, older than its committed run's 20"
    ]
    assert v.reruns == ["t0 succeeded under tokens 10, 20"]
    assert (v.superseded_runs, v.fed_superseded) == (1, 1)


def test_a_consumer_fed_by_a_superseded_run_and_cancelled_is_counted_not_a_violation() -> None:
    """The frozen agent's consumer got the old run's output and was cancelled there; the
    committed consumer ran on the committed producer run."""
    old = stored("t0", "succeeded", 10, ts=103.1, ran=3.0, agent="bs0-0001")
    stale = stored("t1", "cancelled", 10, ts=103.2, inputs={"t0": 10}, agent="bs0-0001")
    new = stored("t0", "succeeded", 20, ts=102.5, agent="bs1-0001")
    c = stored("t1", "succeeded", 20, ts=102.7, inputs={"t0": 20}, agent="bs1-0001")
    v = judge_pipeline(CHAIN, [new, c, old, stale], committed(new, c), booked={10: 100, 20: 102})
    assert not (v.superseded or v.early or v.twice or v.untokened or v.incomplete)
    assert (v.superseded_runs, v.fed_superseded) == (1, 1)


def test_a_re_run_of_a_lost_output_with_a_newer_token_is_fine() -> None:
    """P committed under 10, its output lost with its agent, re-run under 20 for C: the
    first commit stands, and C on the re-run is on the same output."""
    first = stored("t0", "succeeded", 10, ts=100.1)
    rerun = stored("t0", "succeeded", 20, ts=103.0, agent="bs-0002")
    c = stored("t1", "succeeded", 20, ts=103.5, inputs={"t0": 20})
    v = judge_pipeline(CHAIN, [first, rerun, c], committed(first, c), booked={10: 100.0, 20: 102})
    assert not v.superseded and not v.early
    assert v.reruns == ["t0 succeeded under tokens 10, 20"]  # a failure must justify it
    assert (v.superseded_runs, v.fed_superseded) == (0, 0)  # newer than the committed run


def test_an_input_token_no_run_of_the_producer_succeeded_under_is_a_violation() -> None:
    p = stored("t0", "succeeded", 10, ts=100.1)
    failed = stored("t0", "failed", 15, ts=100.2)
    c = stored("t1", "succeeded", 10, ts=100.5, inputs={"t0": 15})
    v = judge_pipeline(CHAIN, [p, failed, c], committed(p, c))
    assert v.superseded == ["t1 (token 10) ran on t0 under token 15, which never succeeded"]


def test_an_end_that_names_no_run_of_a_dep_is_a_violation() -> None:
    p = stored("t0", "succeeded", 10, ts=100.1)
    c = stored("t1", "succeeded", 10, ts=100.5, inputs={})
    v = judge_pipeline(CHAIN, [p, c], committed(p, c))
    assert v.superseded == ["t1 (token 10) ran on t0 names no run of it"]


def test_a_consumer_started_before_its_producer_could_have_ended_is_a_violation() -> None:
    """C says it ran on P's run under 20, booked at 102.0 and running 0.5 s: it cannot have
    ended before 102.5, and C (0.1 s long) ended at 102.3, so it started at 102.2."""
    old = stored("t0", "succeeded", 10, ts=100.5)
    new = stored("t0", "succeeded", 20, ts=102.6, ran=0.5)
    c = stored("t1", "succeeded", 20, ts=102.3, inputs={"t0": 20})
    v = judge_pipeline(CHAIN, [old, c, new], committed(new, c), booked={10: 100.0, 20: 102.0})
    assert v.early == [
        "t1 (token 20) started 300.0 ms before t0's run under token 20 could have ended "
        "(booked, its inputs' earliest ends, its run time)"
    ]
    assert v.margin_s == pytest.approx(-0.3)


def test_the_earliest_end_follows_the_runs_the_producer_took_its_inputs_from() -> None:
    """t0 -> t1 -> t2, all booked at 100: t1 cannot have started before t0 could have ended
    (100.4), so it cannot have ended before 100.6, and t2 dated 100.5 is early."""
    deps = {"t0": (), "t1": ("t0",), "t2": ("t1",)}
    a = stored("t0", "succeeded", 10, ts=100.45, ran=0.4)
    b = stored("t1", "succeeded", 10, ts=100.7, ran=0.2, inputs={"t0": 10})
    c = stored("t2", "succeeded", 10, ts=100.6, ran=0.1, inputs={"t1": 10})
    v = judge_pipeline(deps, [a, c, b], committed(a, b, c), booked={10: 100.0})
    assert len(v.early) == 1 and v.early[0].startswith("t2 (token 10) started 100.0 ms before")


def test_publish_lag_of_the_producers_end_event_is_counted_not_a_violation() -> None:
    """P's end event waited 40 ms in its agent's outbox while C, on the same agent, already
    ran: by stream times C started before P ended, but not before P could have ended."""
    p = stored("t0", "succeeded", 10, ts=100.14, ran=0.1)  # ended at 100.10 on the agent
    c = stored("t1", "succeeded", 10, ts=100.21, ran=0.1, inputs={"t0": 10})  # from 100.11
    v = judge_pipeline(CHAIN, [p, c], committed(p, c), booked={10: 100.0})
    assert not v.early
    assert v.early_by_ends == 1
    assert len(v.dated_early) == 1 and v.dated_early[0].startswith("t1 (token 10) dated 30.0 ms")


def test_a_started_event_dates_a_run_by_the_less_lagged_of_its_two_events() -> None:
    started = stored("t0", "started", 10, ts=100.06, ran=0.05)  # began 100.01
    end = stored("t0", "succeeded", 10, ts=100.2, ran=0.1)  # ended 100.2 by itself
    assert run_span(end, None) == pytest.approx((100.1, 100.2))
    assert run_span(end, 100.01) == pytest.approx((100.01, 100.11))
    c = stored("t1", "succeeded", 10, ts=100.25, ran=0.12, inputs={"t0": 10})  # from 100.13
    v = judge_pipeline(CHAIN, [started, end, c], committed(end, c), booked={10: 100.0})
    assert v.early_by_ends == 1  # by end events alone: 70 ms early
    assert not v.dated_early and v.closest_s == pytest.approx(0.02)
    assert v.lag_spread_ms == pytest.approx([90.0])


def test_a_run_ended_twice_under_one_token_is_a_violation_a_resent_end_is_not() -> None:
    p = stored("t0", "succeeded", 10, ts=100.1, event_id="inc-a")
    again = stored("t0", "succeeded", 10, ts=160.0, event_id="inc-a")  # sent again, same id
    events, copies = first_copies([again, p])
    assert events == [p] and copies == 1
    assert not judge_pipeline({"t0": ()}, events, None).twice
    second = stored("t0", "failed", 10, ts=100.3, event_id="inc-b")
    v = judge_pipeline({"t0": ()}, [p, second], None)
    assert v.twice == [
        "t0 ended 2 times under token 10: succeeded (event inc-a, bs-0001), "
        "failed (event inc-b, bs-0001)"
    ]
    assert v.runs == 1


def test_a_cancelled_answer_is_no_run_end() -> None:
    """An agent asked about a job it does not hold says `cancelled` (no input tokens)."""
    p = stored("t1", "succeeded", 10, ts=100.1, inputs={"t0": 9})
    gone = stored("t1", "cancelled", 10, ts=100.3, inputs=None)
    v = judge_pipeline(CHAIN, [p, gone], None)
    assert not v.twice and not v.untokened


def test_an_end_without_input_tokens_of_a_task_with_deps_is_a_violation() -> None:
    p = stored("t0", "succeeded", 10, ts=100.1, inputs=None)  # no deps: nothing to say
    c = stored("t1", "succeeded", 10, ts=100.5, inputs=None)
    c = Stored(c.seq, c.ts, c.ev.model_copy(update={"input_tokens": None}))
    v = judge_pipeline(CHAIN, [p, c], committed(p, c))
    assert v.untokened == [
        f"t1 succeeded under token 10 on bs-0001 (event {c.ev.event_id}) says no input tokens"
    ]
    assert not v.superseded  # judged once, as untokened


def test_a_committed_result_without_its_event_in_the_stream_is_incomplete() -> None:
    p = stored("t0", "succeeded", 10, ts=100.1)
    c = stored("t1", "succeeded", 10, ts=100.5, inputs={"t0": 10})
    v = judge_pipeline(CHAIN, [p], committed(p, c))
    assert v.incomplete == [
        f"t1: committed under token 10 from event {c.ev.event_id}, which MARS_EVENTS does "
        "not hold as its success"
    ]
    assert judge_pipeline(CHAIN, [p, c], committed(p)).incomplete == ["t1: no committed result"]


def test_a_pipeline_that_did_not_succeed_has_only_its_runs_judged() -> None:
    c = stored("t1", "succeeded", 10, ts=100.5, inputs={"t0": 3})
    v = judge_pipeline(CHAIN, [c], None)
    assert not v.superseded and not v.incomplete and v.inputs == 0


def test_committed_results_keep_the_first_commit_and_report_a_change() -> None:
    p = stored("t0", "succeeded", 10, ts=100.1)
    later = stored("t0", "succeeded", 20, ts=101.0)
    first = TaskResults(pipeline_id=PID, results=[TaskResult.of(p.ev, "a")])
    same = TaskResults(pipeline_id=PID, results=[TaskResult.of(p.ev, "a")])
    changed = TaskResults(pipeline_id=PID, results=[TaskResult.of(later.ev, "b")])
    kept, rewritten = committed_results([first, same])
    assert kept[PID]["t0"].token == 10 and not rewritten
    kept, rewritten = committed_results([first, changed])
    assert kept[PID]["t0"].token == 10
    assert rewritten == {
        PID: [
            f"t0: committed under token 10 (event {p.ev.event_id}), later under 20 "
            f"(event {later.ev.event_id})"
        ]
    }


def test_reruns_fail_the_audit_only_when_nothing_justified_them() -> None:
    first = stored("t0", "succeeded", 10, ts=100.1)
    rerun = stored("t0", "succeeded", 20, ts=101.0)
    v = judge_pipeline({"t0": ()}, [first, rerun], committed(first))
    for strict, bad in ((False, 0), (True, 1)):
        flow = Dataflow(strict_reruns=strict)
        flow.add(PID, v, judged=True)
        assert flow.violations() == bad
        assert flow.found["reruns"] == [(PID, "t0 succeeded under tokens 10, 20")]


def test_the_fleet_is_one_process_as_before_or_split_with_distinct_prefixes_and_state(
    tmp_path: Path,
) -> None:
    ((name, cmd),) = fleet_processes(50, 1, "nats://x", tmp_path)
    assert name == "sim-agents"
    assert cmd[cmd.index("--prefix") + 1] == "bs" and cmd[cmd.index("--count") + 1] == "50"
    split = fleet_processes(50, 4, "nats://x", tmp_path)
    assert [n for n, _ in split] == [f"sim-agents-{k}" for k in range(4)]
    opt = [{c[i]: c[i + 1] for i in range(2, len(c) - 1, 2)} for _, c in split]
    assert [int(o["--count"]) for o in opt] == [13, 13, 12, 12]
    assert len({o["--prefix"] for o in opt}) == 4
    assert len({o["--state-dir"] for o in opt}) == 4
    assert stopped_share(50, 4) == pytest.approx(13 / 50)  # under the partition rule's 30%


@pytest.mark.parametrize(
    "argv",
    [
        ["--stop-agents-after", "5"],
        ["--stop-agents-after", "5", "--agent-processes", "4", "--stop-for", "0"],
    ],
)
def test_the_stress_refuses_a_stop_of_the_whole_fleet_or_of_no_length(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "--stop-agents-after needs --agent-processes 2" in capsys.readouterr().err


def test_cluster_events_count_distinct_agents_and_each_partition() -> None:
    said = [
        ClusterEvent(kind="agent_dead", agents=["bs0-0001"], orchestrator="a"),
        ClusterEvent(kind="agent_dead", agents=["bs0-0001"], orchestrator="b"),
        ClusterEvent(kind="agent_dead", agents=["bs0-0002"], orchestrator="a"),
        ClusterEvent(kind="partition_suspected", agents=["bs0-0001", "bs0-0002"]),
    ]
    assert cluster_summary(said) == {"agent_dead": 2, "partition_suspected": 1}
