"""Agent admission and readiness, driven synchronously through the state machine."""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import ValidationError

from edge_agent.core import AgentCore
from schemas import (
    CancelCommand,
    CommitCommand,
    DataTransfer,
    DeviceSpec,
    InputRef,
    OnnxRun,
    TaskOffer,
    TaskSpec,
)

SHA = "0" * 64


def core(**kw: Any) -> AgentCore:
    devices = [DeviceSpec(device_id="cpu0", kind="cpu", slots=1, memory_mb=1000.0)]
    return AgentCore("a1", "inc1", devices, ["synthetic", "onnx"], **kw)


def offer(
    task_id: str = "t", token: int = 1, deps: tuple[str, ...] = (), order: int = 0, **kw: Any
) -> TaskOffer:
    task = TaskSpec.model_validate(
        {
            "id": task_id,
            "run": kw.pop("run", {"kind": "synthetic"}),
            "requires": kw.pop("requires", {}),
        }
    )
    base: dict[str, Any] = dict(
        pipeline_id="p",
        agent_id="a1",
        incarnation="inc1",
        device_id="cpu0",
        token=token,
        order=order,
        task=task,
        inputs=[InputRef(task_id=d, agent_id="a2") for d in deps],
    )
    base.update(kw)
    return TaskOffer(**base)


def test_rejections_carry_codes() -> None:
    c = core(model_problem=lambda run: "model 'x' not found")
    cases = {
        "stale_incarnation": offer(incarnation="old"),
        "unknown_device": offer(device_id="gpu9"),
        "kind_not_allowed": offer(run={"kind": "exec", "argv": ["ls"]}),
        "no_memory": offer(requires={"min_memory_mb": 5000.0}),
        "missing_model": offer(run={"kind": "onnx", "model": "x"}),
        "bad_spec": offer(slot=3),
    }
    for code, o in cases.items():
        r = c.admit(o)
        assert not r.accepted and r.code == code and r.reason, (code, r)
    c.draining = True
    assert c.admit(offer()).code == "draining"


def test_duplicate_offer_is_idempotent_and_stale_token_rejected() -> None:
    c = core()
    assert c.admit(offer(token=5)).accepted
    assert c.admit(offer(token=5)).accepted
    assert len(c.jobs) == 1
    r = c.admit(offer(token=4))
    assert not r.accepted and r.code == "stale_token"


def test_runs_only_when_committed_and_inputs_arrived_in_order_within_slots() -> None:
    c = core()
    assert c.admit(offer("b", deps=("x",), order=2)).accepted
    assert c.admit(offer("a", order=1)).accepted
    assert c.admit(offer("z", order=3)).accepted
    assert c.take_ready() == []  # nothing committed yet
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a", "b", "z"]))
    first = c.take_ready()
    assert [j.offer.task.id for j in first] == ["a"]  # one slot, plan order
    assert c.take_ready() == []
    ack = c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="b", token=1, data=b"1", sha256=SHA)
    )
    assert ack.ok
    c.finish(("p", "a"), ok=True)
    assert [j.offer.task.id for j in c.take_ready()] == ["b"]
    bad = c.deliver(
        DataTransfer(pipeline_id="p", producer="nope", consumer="z", token=1, data=b"", sha256=SHA)
    )
    assert not bad.ok
    # a finished task offered again is recognised
    assert c.admit(offer("a")).code == "duplicate"


def test_cancel_drops_queued_jobs_and_reports_running_ones() -> None:
    c = core()
    c.admit(offer("a", order=1))
    c.admit(offer("b", order=2))
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a", "b"]))
    c.take_ready()
    out = c.cancel(CancelCommand(pipeline_id="p"))
    assert {j.offer.task.id: j.state for j in out} == {"a": "running", "b": "cancelled"}
    assert list(c.jobs) == [("p", "a")]
    c.finish(("p", "a"), ok=False)
    assert c.running_total == 0


def test_onnx_model_check_uses_builtin_models() -> None:
    from edge_agent.executors import OnnxExecutor

    ex = OnnxExecutor()
    assert ex.has_model(OnnxRun(model="tiny_cnn")) is None
    # refused by the schema; past it (an older sender), the agent does not look outside
    escaping = OnnxRun.model_construct(model="../../etc/passwd", sha256=None)
    assert "not found" in (ex.has_model(escaping) or "")
    assert "sha256" in (ex.has_model(OnnxRun(model="tiny_cnn", sha256="a" * 64)) or "")


def test_provisional_offer_runs_only_under_the_token_its_commit_brings() -> None:
    c = core()
    assert c.admit(offer("a", token=0)).accepted
    assert c.admit(offer("a", token=0)).accepted  # a retried provisional offer
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a"]))  # no token: must not run
    assert not c.jobs[("p", "a")].committed and c.take_ready() == []
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[7]))
    [job] = c.take_ready()
    assert job.offer.token == 7  # events and outputs are tagged with it
    # a provisional offer never displaces a placement that has a token
    assert c.admit(offer("b", token=3)).accepted
    assert c.admit(offer("b", token=0)).code == "stale_token"


def test_commit_with_another_placements_token_is_ignored() -> None:
    c = core()
    assert c.admit(offer("a", token=5)).accepted
    assert c.commit(CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[4])) == 0
    assert c.take_ready() == []
    assert c.commit(CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[5])) == 1
    assert [j.offer.token for j in c.take_ready()] == [5]


def test_commit_tokens_must_match_the_tasks() -> None:
    with pytest.raises(ValidationError):
        CommitCommand(pipeline_id="p", task_ids=["a", "b"], tokens=[1])
    assert CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[2]).token_of() == {"a": 2}


def test_cancel_leaves_a_later_placement_alone() -> None:
    c = core()
    assert c.admit(offer("a", token=0)).accepted
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["a"], max_token=0))
    assert ("p", "a") not in c.jobs
    assert c.admit(offer("a", token=9)).accepted  # its next placement has a real token
    # a late withdrawal of the provisional offer does not touch the new placement
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["a"], max_token=0))
    assert c.jobs[("p", "a")].offer.token == 9


def test_placed_here_again_keeps_the_inputs_that_arrived() -> None:
    """A consumer re-placed onto the same agent (newer token) keeps delivered inputs: their
    producers count them delivered and may have released them."""
    c = core()
    assert c.admit(offer("b", token=5, deps=("x", "y"))).accepted
    ack = c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="b", token=1, data=b"1", sha256=SHA)
    )
    assert ack.ok
    assert c.admit(offer("b", token=9, deps=("x", "y"))).accepted  # moved here again
    assert c.jobs[("p", "b")].offer.token == 9
    assert c.jobs[("p", "b")].inputs == {"x": b"1"}
    c.commit(CommitCommand(pipeline_id="p", task_ids=["b"], tokens=[9]))
    assert c.take_ready() == []  # y has not arrived
    c.deliver(
        DataTransfer(pipeline_id="p", producer="y", consumer="b", token=1, data=b"2", sha256=SHA)
    )
    assert [j.offer.task.id for j in c.take_ready()] == ["b"]
    # an input the new placement no longer has is not carried over
    assert c.admit(offer("d", token=5, deps=("x",))).accepted
    c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="d", token=1, data=b"1", sha256=SHA)
    )
    assert c.admit(offer("d", token=6, deps=())).accepted
    assert c.jobs[("p", "d")].inputs == {}


def test_a_withdrawn_job_leaves_its_inputs_for_its_next_placement_here() -> None:
    """A re-plan withdraws a consumer that holds an input (its producer counts it delivered)
    and offers it here again: the input is still there. A whole pipeline's cancel drops
    them."""
    c = core()
    assert c.admit(offer("b", token=5, deps=("x",))).accepted
    c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="b", token=1, data=b"1", sha256=SHA,
                     media_type="application/json")
    )  # fmt: skip
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["b"], max_token=5))
    assert ("p", "b") not in c.jobs
    assert c.admit(offer("b", token=7, deps=("x",))).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=["b"], tokens=[7]))
    [job] = c.take_ready()  # nothing to wait for
    assert job.offer.task.id == "b"
    assert job.input_types == {"x": "application/json"}  # still decoded as it was made
    # withdrawn, then the pipeline cancelled: nothing is kept for a later offer
    assert c.admit(offer("d", token=5, deps=("x",))).accepted
    c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="d", token=1, data=b"1", sha256=SHA)
    )
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["d"], max_token=5))
    c.cancel(CancelCommand(pipeline_id="p"))
    assert c.admit(offer("d", token=9, deps=("x",))).accepted
    assert c.jobs[("p", "d")].inputs == {}


def test_an_input_for_a_withdrawn_job_is_not_taken_as_consumed() -> None:
    """An output that reaches a job a re-plan withdrew must not be acknowledged as consumed
    (its producer would let it go, and the task's next placement would find it gone); one
    for a job that ran, or of a cancelled pipeline, is."""
    c = core()
    assert c.admit(offer("b", token=5, deps=("x",))).accepted
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["b"], max_token=5))
    assert not c.finished(("p", "b"))
    assert c.admit(offer("b", token=7, deps=("x",))).accepted  # here again
    c.cancel(CancelCommand(pipeline_id="p"))
    assert c.finished(("p", "b"))


def test_an_offer_replacing_a_placement_that_ran_here_is_refused() -> None:
    """A re-placement names the token it replaces: if that placement already ran here, the
    task is not run again (`already_ran`); one that was only withdrawn, or another placement
    than the one that ran, is taken."""
    c = core()
    assert c.admit(offer("a", token=5)).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[5]))
    assert [j.offer.task.id for j in c.take_ready()] == ["a"]
    assert c.finish(("p", "a"), ok=True) is not None
    again = c.admit(offer("a", token=8, replaces=5))
    assert not again.accepted and again.code == "already_ran" and "token 5" in again.reason
    assert c.admit(offer("a", token=9, replaces=4)).accepted  # not the placement that ran
    assert c.admit(offer("b", token=5)).accepted
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["b"], max_token=5))  # withdrawn unrun
    assert c.admit(offer("b", token=8, replaces=5)).accepted


def test_an_offer_replacing_a_placement_running_here_is_refused() -> None:
    """A re-placement of a task whose replaced placement is running here keeps it running
    (`already_running`) rather than asking for a second run; an offer that names another
    placement, or none, is a `duplicate` of the running job as before."""
    c = core()
    assert c.admit(offer("a", token=5)).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=["a"], tokens=[5]))
    assert [j.offer.task.id for j in c.take_ready()] == ["a"]
    again = c.admit(offer("a", token=8, replaces=5))
    assert not again.accepted and again.code == "already_running" and "token 5" in again.reason
    for other in (offer("a", token=9, replaces=4), offer("a", token=9)):
        reply = c.admit(other)
        assert not reply.accepted and reply.code == "duplicate"
    assert c.jobs[("p", "a")].offer.token == 5 and c.jobs[("p", "a")].state == "running"


def test_a_provisional_offer_withdrawn_uncommitted_does_not_refuse_the_next_one() -> None:
    """A placement that failed part-way withdraws its provisional offers (token 0); the same
    pipeline id placed again offers provisionally too, and is taken. A provisional job that
    was cancelled with its pipeline, or one withdrawn under a token, still refuses a token-0
    offer (a late copy of an old one)."""
    c = core()
    assert c.admit(offer("t", token=0)).accepted
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["t"], max_token=0))
    assert c.admit(offer("t", token=0)).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=["t"], tokens=[3]))
    assert [j.offer.token for j in c.take_ready()] == [3]
    cancelled = core()
    assert cancelled.admit(offer("t", token=0)).accepted
    cancelled.cancel(CancelCommand(pipeline_id="p"))
    assert cancelled.admit(offer("t", token=0)).code == "duplicate"
    moved = core()
    assert moved.admit(offer("t", token=4)).accepted
    moved.cancel(CancelCommand(pipeline_id="p", task_ids=["t"], max_token=4))
    assert moved.admit(offer("t", token=0)).code == "duplicate"


def test_an_output_older_than_the_producer_placement_planned_with_is_refused() -> None:
    """The consumer's offer names the producer run it takes: an output made under any other
    token (a placement since replaced, pushing late, or one not told to this consumer yet) is
    refused, that one is taken."""
    c = core()
    planned = offer("b", deps=("x",), inputs=[InputRef(task_id="x", agent_id="a2", token=40)])
    assert c.admit(planned).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=["b"]))

    def push(token: int) -> Any:
        return c.deliver(
            DataTransfer(pipeline_id="p", producer="x", consumer="b", token=token, data=b"1",
                         sha256=SHA)
        )  # fmt: skip

    stale = push(39)
    assert not stale.ok and "output of x under token 39" in stale.reason
    assert not push(41).ok
    assert c.take_ready() == []  # still waiting for its input
    assert push(40).ok
    assert [j.offer.task.id for j in c.take_ready()] == ["b"]
    # a provisional first placement's consumer knows no token yet: any output is taken
    c2 = core()
    assert c2.admit(offer("b", deps=("x",))).accepted
    c2.commit(CommitCommand(pipeline_id="p", task_ids=["b"]))
    assert c2.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="b", token=1, data=b"1", sha256=SHA)
    ).ok


def _push(c: AgentCore, producer: str, token: int, consumer: str = "b") -> Any:
    return c.deliver(
        DataTransfer(pipeline_id="p", producer=producer, consumer=consumer, token=token,
                     data=b"1", sha256=SHA)
    )  # fmt: skip


def test_a_consumer_told_of_its_producers_new_run_drops_the_old_runs_output() -> None:
    """A producer placed again: its consumer, staying where it is, is offered again under its
    own token naming the producer's new run. An output of the old run that came first is let
    go (the consumer waits for the new one), and later pushes of the old run are refused."""
    c = core()
    first = offer("b", token=5, inputs=[InputRef(task_id="x", agent_id="a2"),
                                         InputRef(task_id="y", agent_id="a2")])  # fmt: skip
    assert c.admit(first).accepted
    c.commit(CommitCommand(pipeline_id="p", task_ids=["b"]))
    assert _push(c, "x", 7).ok  # the old run of x (any run: not told of one yet)
    assert _push(c, "y", 8).ok
    told = first.model_copy(
        update={
            "inputs": [
                InputRef(task_id="x", agent_id="a3", token=9),
                InputRef(task_id="y", agent_id="a2", token=8),
            ]
        }
    )
    assert c.admit(told).accepted
    assert c.take_ready() == []  # x's old output is gone; y's, from the run named, stays
    assert c.jobs[("p", "b")].input_tokens == {"y": 8}
    assert not _push(c, "x", 7).ok
    assert _push(c, "x", 9).ok
    [job] = c.take_ready()
    assert job.input_tokens == {"x": 9, "y": 8}
    c.finish(job.key, True)
    assert job.input_tokens == {"x": 9, "y": 8}  # kept for its end event


def test_inputs_kept_for_a_withdrawn_job_are_fenced_at_its_next_offer() -> None:
    c = core()
    ins = [InputRef(task_id="x", agent_id="a2", token=3)]
    assert c.admit(offer("b", token=5, inputs=ins)).accepted
    assert _push(c, "x", 3).ok
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["b"]))  # withdrawn: inputs kept
    again = [InputRef(task_id="x", agent_id="a2", token=3)]
    assert c.admit(offer("b", token=6, inputs=again)).accepted
    assert c.jobs[("p", "b")].input_tokens == {"x": 3}  # the same run: kept
    c.cancel(CancelCommand(pipeline_id="p", task_ids=["b"]))
    moved = [InputRef(task_id="x", agent_id="a4", token=4)]
    assert c.admit(offer("b", token=7, inputs=moved)).accepted
    assert c.jobs[("p", "b")].inputs == {}  # x ran again since: the old output is not taken


NOW = 1_000.0  # the booking clock when the test's orchestrator "sent" its messages


def booked(task_id: str, start: float, end: float, *, pid: str = "p", prio: int = 100,
           deps: tuple[str, ...] = (), order: int = 0) -> TaskOffer:  # fmt: skip
    return offer(task_id, pipeline_id=pid, window_start=NOW + start, window_end=NOW + end,
                 priority=prio, deps=deps, order=order)  # fmt: skip


def run_in_order(c: AgentCore) -> list[str]:
    """Start what may start, one at a time, each finishing before the next is taken."""
    out = []
    while started := c.take_ready():
        for job in started:
            out.append(f"{job.offer.pipeline_id}/{job.offer.task.id}")
            c.finish(job.key, True)
    return out


def commit_all(c: AgentCore, *tasks: tuple[str, str]) -> None:
    for pid, t in tasks:
        c.commit(CommitCommand(pipeline_id=pid, task_ids=[t]))


def test_ready_tasks_run_in_the_order_of_their_booked_windows_across_pipelines() -> None:
    """A low-priority pipeline's tasks booked first run first: a later pipeline's task,
    booked after them, does not jump ahead because it is first in its own plan (the plan's
    order is each pipeline's own). Equal windows: the higher priority first."""
    c = core()
    c.set_clock(NOW)
    for i, (s, e) in enumerate([(0, 3), (3, 6), (6, 9)]):
        assert c.admit(booked(f"l{i}", s, e, pid="low", prio=10, order=i)).accepted
    assert c.admit(booked("h0", 7.7, 10.7, pid="high", prio=500, order=0)).accepted
    assert c.admit(booked("m0", 7.7, 10.7, pid="mid", prio=5, order=0)).accepted
    commit_all(c, ("high", "h0"), ("mid", "m0"), ("low", "l2"), ("low", "l1"), ("low", "l0"))
    assert run_in_order(c) == ["low/l0", "low/l1", "low/l2", "high/h0", "mid/m0"]


def test_a_ready_task_goes_ahead_of_its_window_only_where_it_delays_no_earlier_one() -> None:
    c = core()
    c.set_clock(NOW)
    # w is booked at +5 s and waits for its input; r, booked later, is ready now
    assert c.admit(booked("w", 5, 6, deps=("x",))).accepted
    assert c.admit(booked("short", 20, 21)).accepted  # 1 s: done well before w's window
    assert c.admit(booked("long", 30, 40)).accepted  # 10 s: would run through w's window
    commit_all(c, ("p", "w"), ("p", "short"), ("p", "long"))
    assert [j.offer.task.id for j in c.take_ready()] == ["short"]  # backfilled
    c.finish(("p", "short"), True)
    assert c.take_ready() == []  # long waits for w
    assert c.recheck_at is not None and c.recheck_at > time.monotonic() + 5.0
    assert c.deliver(
        DataTransfer(pipeline_id="p", producer="x", consumer="w", token=1, data=b"1",
                     sha256=SHA)
    ).ok  # fmt: skip
    assert [j.offer.task.id for j in c.take_ready()] == ["w"]  # its input came: w runs
    c.finish(("p", "w"), True)
    assert [j.offer.task.id for j in c.take_ready()] == ["long"]


def test_a_window_whose_job_never_got_ready_stops_holding_once_it_is_over() -> None:
    c = core()
    c.set_clock(NOW - 100.0)  # w's window ended long ago: its plan has slipped
    assert c.admit(booked("w", 5, 6, deps=("x",))).accepted
    assert c.admit(booked("r", 30, 40)).accepted
    commit_all(c, ("p", "w"), ("p", "r"))
    assert [j.offer.task.id for j in c.take_ready()] == ["r"]


def test_without_a_clock_or_windows_jobs_start_in_plan_order() -> None:
    """Offers of an orchestrator of an older release name no window: plan order, as before."""
    c = core()
    assert c.admit(offer("b", order=1)).accepted
    assert c.admit(offer("a", order=0)).accepted
    commit_all(c, ("p", "b"), ("p", "a"))
    assert run_in_order(c) == ["p/a", "p/b"]
