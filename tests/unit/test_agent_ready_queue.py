"""The agent's ready queue: jobs start as a scan of every queued job would start them, and an
event costs no visit to the jobs it did not make ready."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.core import AgentCore, Job
from schemas import CancelCommand, CommitCommand, DataTransfer
from tests.unit.agent_jobs import PIPELINES, TASKS, core, offer

SHA = "0" * 64


def data(pid: str, producer: str, consumer: str) -> DataTransfer:
    return DataTransfer(
        pipeline_id=pid, producer=producer, consumer=consumer, token=1, data=b"x", sha256=SHA
    )


def by_scan(c: AgentCore) -> list[tuple[str, str]]:
    """What starts now, worked out the plain way: every job looked at, ready ones in plan
    order, as many per device as it has free slots."""
    ready = sorted(
        (j for j in c.jobs.values() if j.ready()),
        key=lambda j: (j.offer.order, j.offer.pipeline_id, j.offer.task.id),
    )
    free = {d: spec.slots - c.running[d] for d, spec in c.devices.items()}
    out = []
    for j in ready:
        if free[j.offer.device_id] > 0:
            free[j.offer.device_id] -= 1
            out.append(j.key)
    return out


pids = st.sampled_from(PIPELINES)
tids = st.sampled_from(TASKS)
ops = st.one_of(
    st.tuples(
        st.just("admit"),
        pids,
        tids,
        st.integers(0, 3),  # token (0: provisional)
        st.integers(0, 5),  # order
        st.sampled_from(["cpu0", "gpu0"]),
        st.lists(tids, max_size=2, unique=True),
    ),
    st.tuples(
        st.just("commit"),
        pids,
        st.lists(tids, min_size=1, max_size=4, unique=True),
        st.one_of(st.none(), st.integers(1, 3)),
    ),
    st.tuples(st.just("deliver"), pids, tids, tids),
    st.tuples(st.just("finish"), st.integers(0, 7), st.booleans()),
    st.tuples(
        st.just("cancel"),
        pids,
        st.one_of(st.none(), st.lists(tids, min_size=1, max_size=3, unique=True)),
    ),
    st.tuples(st.just("take")),
)


def apply(c: AgentCore, op: tuple[Any, ...], running: list[Job]) -> None:
    kind = op[0]
    if kind == "admit":
        _, pid, tid, token, order, device, deps = op
        c.admit(offer(pid, tid, token, order, device, tuple(d for d in deps if d != tid)))
    elif kind == "commit":
        _, pid, task_ids, token = op
        tokens = None if token is None else [token] * len(task_ids)
        c.commit(CommitCommand(pipeline_id=pid, task_ids=task_ids, tokens=tokens))
    elif kind == "deliver":
        _, pid, producer, consumer = op
        if producer != consumer:
            c.deliver(data(pid, producer, consumer))
    elif kind == "finish":
        _, i, ok = op
        if running:
            job = running.pop(i % len(running))
            c.finish(job.key, ok)
    elif kind == "cancel":
        _, pid, task_ids = op
        c.cancel(CancelCommand(pipeline_id=pid, task_ids=task_ids))


@settings(max_examples=400, deadline=None)
@given(st.lists(ops, max_size=60))
def test_jobs_start_as_a_scan_of_every_job_would_start_them(seq: list[tuple[Any, ...]]) -> None:
    c = core()
    running: list[Job] = []
    for op in [*seq, ("take",)]:
        apply(c, op, running)
        if op[0] == "take" or op[0] in ("commit", "deliver", "finish"):
            want = by_scan(c)
            got = c.take_ready()
            assert [j.key for j in got] == want
            assert all(j.state == "running" for j in got)
            running.extend(got)
        assert all(c.running[d] <= spec.slots for d, spec in c.devices.items())
        assert sum(c.running.values()) == sum(1 for j in c.jobs.values() if j.state == "running")


def test_an_event_visits_no_job_it_did_not_make_ready(monkeypatch: Any) -> None:
    c = core()
    for i in range(2000):  # committed, each waiting for an input from elsewhere
        assert c.admit(offer("p0", f"w{i}", 1, i, "cpu0", ("src",))).accepted
    c.commit(CommitCommand(pipeline_id="p0", task_ids=[f"w{i}" for i in range(2000)]))
    assert c.take_ready() == []
    visits = 0
    ready = Job.ready

    def counted(self: Job) -> bool:
        nonlocal visits
        visits += 1
        return ready(self)

    monkeypatch.setattr(Job, "ready", counted)
    assert c.deliver(data("p0", "src", "w7")).ok
    started = c.take_ready()
    assert [j.key for j in started] == [("p0", "w7")]
    assert visits <= 4  # the job the input completed, not the 1,999 still waiting
    c.finish(("p0", "w7"), ok=True)
    assert c.take_ready() == [] and visits <= 4


def test_a_ready_job_offered_again_starts_once_under_the_new_offer() -> None:
    c = core()
    first = offer("p0", "t0", 1, 0, "cpu0", ())
    assert c.admit(offer("p0", "busy", 1, 0, "cpu0", ())).accepted
    assert c.admit(first).accepted
    c.commit(CommitCommand(pipeline_id="p0", task_ids=["busy", "t0"]))
    assert [j.offer.task.id for j in c.take_ready()] == ["busy"]  # the one slot is taken
    again = [offer("p0", "t0", 1, 0, "cpu0", ()) for _ in range(500)]  # retried offers
    for o in again:
        assert c.admit(o).accepted
    # what was queued for it is not kept without bound while it waits for the slot
    assert len(c._ready["cpu0"]) <= 2 * len(c.jobs) + 64 + 1
    c.finish(("p0", "busy"), ok=True)
    started = c.take_ready()
    assert [j.offer.task.id for j in started] == ["t0"] and started[0].offer is again[-1]
    assert c.take_ready() == []


def test_a_ready_job_offered_again_later_in_plan_order_waits_its_new_turn() -> None:
    c = core()
    for tid, order in (("busy", 0), ("a", 1), ("b", 3)):
        assert c.admit(offer("p0", tid, 1, order, "cpu0", ())).accepted
    c.commit(CommitCommand(pipeline_id="p0", task_ids=["busy", "a", "b"]))
    assert [j.offer.task.id for j in c.take_ready()] == ["busy"]
    assert c.admit(offer("p0", "a", 1, 5, "cpu0", ())).accepted  # same placement, now 5th
    c.finish(("p0", "busy"), ok=True)
    assert [j.offer.task.id for j in c.take_ready()] == ["b"]


def test_the_queue_benchmark_runs_both_ways_to_the_same_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.agent_queue import main

    assert main(["--depths", "3,40", "--tasks", "60"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0] for r in rows] == ["3", "40"]  # one row per depth, each checked equal
    with pytest.raises(SystemExit):
        main(["--depths", "ten"])
