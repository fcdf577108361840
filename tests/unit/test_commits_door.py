"""Commits driven through their door by a stand-in service (tests/unit/doors.py): what each
agent is told, and when an unanswered commit is asked again, with the clock moved by hand.
No NATS, no sleeping."""

from __future__ import annotations

import asyncio
import contextlib

from orchestrator.placement.commits import COMMIT_CONFIRM_S, Commits
from orchestrator.ports import CommitsDoor
from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.base import WireModel
from schemas.pipeline import PipelineSpec
from schemas.placement import CommitCommand
from tests.unit.doors import CommitsService, Sent, turns

PID = "p1"
START = 1000.0  # the stand-in's monotonic clock when the plan was committed


def answered(subject: str, agent_id: str, msg: WireModel) -> WireModel:
    """An agent that hears its commit: it answers with the command."""
    assert subject == subjects.commit(agent_id) and isinstance(msg, CommitCommand)
    return msg


def service() -> tuple[CommitsService, Commits, PipelineRun]:
    """A pipeline of a, b (on agent x) and c (on y, fed by a), committed at START; d was
    never placed. Every placed task accepted, its planned start the plan's time zero."""
    svc = CommitsService(now=START, answer=answered)
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "a", "run": {"kind": "synthetic", "seconds": 0.001}},
        {"id": "b", "run": {"kind": "synthetic", "seconds": 0.001}},
        {"id": "c", "run": {"kind": "synthetic", "seconds": 0.001}, "deps": ["a"]},
        {"id": "d", "run": {"kind": "synthetic", "seconds": 0.001}},
    ]})  # fmt: skip
    run = PipelineRun(PID, spec, START)
    run.state, run.committed_at = "running", START
    for tid, agent, token in (("a", "x", 3), ("b", "x", 4), ("c", "y", 5)):
        tr = run.tasks[tid]
        tr.state, tr.agent_id, tr.device_id, tr.token = "accepted", agent, "cpu0", token
        run.placements[tid] = Placement(tid, f"{agent}:cpu0", 0, 0.0, 1.0)
    svc.pipelines[PID] = run
    door: CommitsDoor = svc  # mypy: the stand-in opens the commits' door
    return svc, Commits(door), run


def commit(agent: str, tids: list[str], tokens: list[int], sent_at: float) -> CommitCommand:
    return CommitCommand(pipeline_id=PID, task_ids=tids, tokens=tokens, sent_at=sent_at)


async def looks(svc: CommitsService, commits: Commits) -> list[Sent]:
    """The looks due by the stand-in's clock now (`confirm_loop`, stopped once it waits),
    and what they spawned run to its end; returns what was sent meanwhile."""
    before = len(svc.sent)
    loop = asyncio.create_task(commits.confirm_loop())
    await turns()
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    await svc.settle()
    return svc.sent[before:]


async def test_a_new_plan_tells_each_agent_its_tasks_with_their_tokens() -> None:
    """Unanswered (a new plan's): one plain message per agent, naming its tasks (sorted) with
    their tokens in that order, stamped with the booking clock; a task with no agent is
    told nowhere, and no agent is asked anything yet."""
    svc, commits, run = service()
    await commits.commit_all(run, {"a", "b", "c", "d"}, unanswered=True)
    wall = svc.wall()
    assert sorted(svc.sent, key=lambda s: s.agent_id) == [
        Sent(subjects.commit("x"), "x", commit("x", ["a", "b"], [3, 4], wall), asked=False),
        Sent(subjects.commit("y"), "y", commit("y", ["c"], [5], wall), asked=False),
    ]
    assert svc.watchdog.asked == [] and commits.resent == 0


async def test_an_unanswered_commit_with_no_start_is_asked_again_once_due() -> None:
    """COMMIT_CONFIRM_S after the commit, a task free to start and not reported started is
    asked again by request (not before), and its agent asked whether it holds the job; a
    task reported started meanwhile is not; one waiting for its input is looked at again
    later, and asked once it has been free to start for COMMIT_CONFIRM_S."""
    svc, commits, run = service()
    await commits.commit_all(run, {"a", "b", "c"}, unanswered=True)
    svc.now = START + COMMIT_CONFIRM_S * 0.9
    assert await looks(svc, commits) == []  # not due yet
    run.tasks["b"].state = "started"  # b's start was heard
    svc.now = START + COMMIT_CONFIRM_S + 0.1
    wall = svc.wall()
    assert await looks(svc, commits) == [
        Sent(subjects.commit("x"), "x", commit("x", ["a"], [3], wall), asked=True)
    ]
    assert svc.watchdog.asked == [(PID, ["a"], "unstarted")] and commits.resent == 1
    assert set(commits.awaited) == {(PID, "c")}  # c waits for a: looked at again later

    # a ends 1.2 s into the run: c is free to start from then, and asked once it has been
    # for COMMIT_CONFIRM_S at its next look (twice the first wait after the one before)
    run.tasks["a"].state, run.tasks["a"].finished_s = "succeeded", 1.2
    svc.now = START + 1.2 + COMMIT_CONFIRM_S * 0.5
    assert await looks(svc, commits) == []
    svc.now = START + COMMIT_CONFIRM_S + 0.1 + 2 * COMMIT_CONFIRM_S + 0.01
    wall = svc.wall()
    assert await looks(svc, commits) == [
        Sent(subjects.commit("y"), "y", commit("y", ["c"], [5], wall), asked=True)
    ]
    assert svc.watchdog.asked[1:] == [(PID, ["c"], "unstarted")] and commits.resent == 2
    assert not commits.awaited


async def test_a_pipeline_not_ours_is_not_asked_about_but_one_held_is_looked_at_again() -> None:
    """A pipeline this replica may not act for is left to its adopter: its commits are not
    asked again, now or later. One whose lease lapsed while still ours is looked at again,
    and asked once the lease is renewed."""
    svc, commits, run = service()
    await commits.commit_all(run, {"a"}, unanswered=True)
    svc.failover.not_ours.add(PID)
    svc.failover.held.add(PID)  # lapsed, still ours
    svc.now = START + COMMIT_CONFIRM_S + 0.1
    assert await looks(svc, commits) == []
    svc.failover.not_ours.clear()  # renewed
    svc.now += COMMIT_CONFIRM_S + 0.1
    assert [s.msg for s in await looks(svc, commits)] == [commit("x", ["a"], [3], svc.wall())]

    svc, commits, run = service()
    await commits.commit_all(run, {"a"}, unanswered=True)
    svc.failover.not_ours.add(PID)  # adopted elsewhere
    svc.now = START + COMMIT_CONFIRM_S + 0.1
    assert await looks(svc, commits) == []
    svc.failover.not_ours.clear()
    svc.now += 10 * COMMIT_CONFIRM_S
    assert await looks(svc, commits) == [] and svc.watchdog.asked == []  # dropped


async def test_a_look_while_behind_on_events_waits_for_them() -> None:
    """Behind on task events, what the look knows of the tasks is old: it asks nothing then,
    and looks again later."""
    svc, commits, run = service()
    await commits.commit_all(run, {"a"}, unanswered=True)
    svc.behind = True
    svc.now = START + COMMIT_CONFIRM_S + 0.1
    assert await looks(svc, commits) == []
    svc.behind = False
    svc.now += COMMIT_CONFIRM_S + 0.1
    assert len(await looks(svc, commits)) == 1 and svc.watchdog.asked == [(PID, ["a"], "unstarted")]


async def test_a_failed_commit_is_asked_again_as_soon_as_its_agent_is_heard_from() -> None:
    """An answered commit that fails is asked again after a back-off, cut short when the
    agent is heard from (its advert after a reconnect): no waiting out the back-off."""
    failures = 1

    def flaky(subject: str, agent_id: str, msg: WireModel) -> WireModel:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("no route")
        return answered(subject, agent_id, msg)

    svc, commits, run = service()
    svc.answer = flaky
    committing = asyncio.create_task(commits.commit_all(run, {"a"}))
    await turns()
    assert len(svc.sent) == 1 and not committing.done()  # failed, backing off
    commits.heard_from("x")
    await turns()
    assert committing.done()  # without waiting out its back-off
    await committing
    assert [(s.agent_id, s.asked) for s in svc.sent] == [("x", True), ("x", True)]
    assert [s.msg.model_dump(exclude={"sent_at"}) for s in svc.sent] == 2 * [
        commit("x", ["a"], [3], 0.0).model_dump(exclude={"sent_at"})
    ]


async def test_a_failed_commit_of_a_task_that_moved_on_is_not_asked_again() -> None:
    """A commit that failed while its task started (or ended) meanwhile is not asked again."""

    def refused(subject: str, agent_id: str, msg: WireModel) -> WireModel:
        run.tasks["a"].state = "started"  # its start heard while the commit failed
        raise ConnectionError("no route")

    svc, commits, run = service()
    svc.answer = refused
    committing = asyncio.create_task(commits.commit_all(run, {"a"}))
    await turns()
    assert committing.done()  # no back-off either: no time passed
    await committing
    assert len(svc.sent) == 1
