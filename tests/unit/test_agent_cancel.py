"""An agent's cancel: the same jobs dropped (and running ones handed back) as a search of
every job would find, and a cancel that names its tasks looks them up instead of going over
the agent's whole queue."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.core import AgentCore
from schemas import CancelCommand, CommitCommand
from tests.unit.agent_jobs import PIPELINES, TASKS, core, offer

Key = tuple[str, str]


def cancel_by_search(c: AgentCore, cmd: CancelCommand) -> tuple[set[Key], set[Key]]:
    """(the keys a cancel hands back, the keys it drops), worked out the plain way."""
    only = None if cmd.task_ids is None else set(cmd.task_ids)
    back, dropped = set(), set()
    for key, job in c.jobs.items():
        if key[0] != cmd.pipeline_id or (only is not None and key[1] not in only):
            continue
        if cmd.max_token is not None and job.offer.token > cmd.max_token:
            continue
        back.add(key)
        if job.state != "running":
            dropped.add(key)
    return back, dropped


jobs = st.lists(
    st.tuples(st.sampled_from(PIPELINES), st.sampled_from(TASKS), st.integers(1, 3), st.booleans()),
    max_size=12,
)
cancels = st.tuples(
    st.sampled_from((*PIPELINES, "p9")),
    st.none() | st.lists(st.sampled_from((*TASKS, "t9")), max_size=8),  # repeats, unknown ids
    st.none() | st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(jobs, cancels)
def test_cancel_drops_what_a_search_of_every_job_would(
    made: list[tuple[str, str, int, bool]], cancel: tuple[str, list[str] | None, int | None]
) -> None:
    c = core()
    for pid, tid, token, run in made:
        o = offer(pid, tid, token, 0, "gpu0", ())
        if c.admit(o).accepted:
            c.commit(CommitCommand(pipeline_id=pid, task_ids=[tid]))
            if run:
                c.take_ready()  # starts what the slots allow
    pid, tids, max_token = cancel
    cmd = CancelCommand(pipeline_id=pid, task_ids=tids, max_token=max_token)
    before = set(c.jobs)
    back, dropped = cancel_by_search(c, cmd)
    out = c.cancel(cmd)
    assert {j.key for j in out} == back
    assert len(out) == len(back)  # a task named twice is handed back once
    assert set(c.jobs) == before - dropped
    assert all(j.state == ("running" if j.key not in dropped else "cancelled") for j in out)


class NoSearch(dict[Key, Any]):
    """A job table that fails any walk over it: only lookups are allowed."""

    def __iter__(self) -> Any:
        raise AssertionError("the cancel went over every job")

    def items(self) -> Any:
        raise AssertionError("the cancel went over every job")

    def values(self) -> Any:
        raise AssertionError("the cancel went over every job")


def test_a_cancel_naming_its_tasks_looks_them_up() -> None:
    c = core()
    for i in range(2_000):
        pid = "busy" if i % 2 else "other"
        assert c.admit(offer(pid, f"t{i}", 1, i, "cpu0", ())).accepted
    c.jobs = NoSearch(c.jobs)
    out = c.cancel(CancelCommand(pipeline_id="busy", task_ids=["t1", "t3", "t4", "t3"]))
    assert sorted(j.key for j in out) == [("busy", "t1"), ("busy", "t3")]
    assert ("busy", "t1") not in c.jobs and ("busy", "t5") in c.jobs
