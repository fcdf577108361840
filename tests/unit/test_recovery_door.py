"""Recovery driven through its door by a stand-in service (tests/unit/doors.py): re-placing
the tasks of an agent gone, putting them back when nothing can take them, retrying them on
the stand-in's clock, and committing results. No NATS: the result ledger's bucket is in
memory, agents answer probes at once, the placer port binds tasks to z through the state
machine (or fails), and the recovery loop is woken by adverts, never by waiting.

The pipeline: a (on y, succeeded) feeds b (on x, started) and c (on x, accepted)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from orchestrator.ports import RecoveryDoor
from orchestrator.reliability.recovery import JOIN_SETTLE_S, STUCK_RETRY_S, Recovery
from orchestrator.scheduling import Placement
from orchestrator.state import lifecycle as lc
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.base import WireModel
from schemas.events import TaskEvent
from schemas.pipeline import PipelineSpec
from schemas.placement import CancelCommand, DataTransfer, FetchRequest
from tests.unit.doors import Answer, RecoveryService, Sent, advert, turns

PID = "p1"
START = 1000.0
TOKENS = {"a": 3, "b": 4, "c": 5}
WHY = "agent x dead (heartbeat)"


def event(eid: str, task: str, state: str, agent: str, token: int) -> TaskEvent:
    return TaskEvent.model_validate(dict(
        event_id=eid, pipeline_id=PID, task_id=task, agent_id=agent, incarnation="i1",
        device_id="cpu0", token=token, state=state, duration_s=0.5,
    ))  # fmt: skip


def holds(subject: str, agent_id: str, msg: WireModel) -> WireModel:
    """A producer's agent that still holds every output it is asked about."""
    assert subject == subjects.fetch(agent_id) and isinstance(msg, FetchRequest)
    return DataTransfer(
        pipeline_id=msg.pipeline_id, producer=msg.producer, consumer=msg.consumer,
        token=msg.token or 0, data=b"", sha256=hashlib.sha256(b"").hexdigest(),
    )  # fmt: skip


def lost(subject: str, agent_id: str, msg: WireModel) -> WireModel:
    """A producer's agent that does not answer (it let the output go, or is busy)."""
    raise TimeoutError(f"{agent_id} did not answer {subject}")


def running(svc: RecoveryService) -> PipelineRun:
    """The pipeline through its state machine: placed, committed, a done on y, b started."""
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "a", "run": {"kind": "synthetic", "seconds": 1.0}},
        {"id": "b", "run": {"kind": "synthetic", "seconds": 1.0}, "deps": ["a"]},
        {"id": "c", "run": {"kind": "synthetic", "seconds": 1.0}, "deps": ["a"]},
    ]})  # fmt: skip
    run = PipelineRun(PID, spec, START)
    agents = {"a": "y", "b": "x", "c": "x"}
    placements = {
        t: Placement(t, f"{agents[t]}:cpu0", 0, s, s + 1.0)
        for t, s in (("a", 0.0), ("b", 1.0), ("c", 2.0))
    }
    tasks = {t: lc.BoundTask(agents[t], "cpu0", TOKENS[t], 1.0, None) for t in TOKENS}
    lc.step(run, lc.Placing(), START)
    lc.step(run, lc.Bound(placements, [], "heft", tasks), START)
    lc.step(run, lc.Committed(), START)
    lc.step(run, lc.Heard(event("e1", "a", "succeeded", "y", 3)), START + 1.0)
    lc.step(run, lc.Heard(event("e2", "b", "started", "x", 4)), START + 1.5)
    svc.pipelines[PID] = run
    return run


def where(run: PipelineRun) -> dict[str, tuple[str, str | None, int]]:
    return {t: (tr.state, tr.agent_id, tr.token) for t, tr in run.tasks.items()}


AS_PLACED = {"a": ("succeeded", "y", 3), "b": ("started", "x", 4), "c": ("accepted", "x", 5)}


@dataclass
class Rig:
    svc: RecoveryService
    rec: Recovery
    run: PipelineRun

    async def settle(self) -> None:
        """What was spawned runs to its end (the recovery loop, which never ends, aside)."""
        await self.svc.settle(leave=self.svc.spawned[:1])

    async def wake(self, now: float) -> None:
        """The clock at `now`, and adverts of y and z heard then (still alive): the recovery
        loop, woken, does what is due by then; what that spawns runs to its end."""
        self.svc.now = now
        for agent in ("y", "z"):
            self.rec.on_advert(advert(agent), now)
        self.rec.wake()  # (a live agent's advert alone does not wake it)
        await turns()
        await self.settle()


@contextlib.asynccontextmanager
async def rig(answer: Answer = holds) -> AsyncIterator[Rig]:
    """Recovery started on the stand-in (its loop the first task spawned), y and z known."""
    svc = RecoveryService(now=START + 2.0, answer=answer, devices=["z:cpu0"])
    door: RecoveryDoor = svc  # mypy: the stand-in opens recovery's door
    rec = Recovery(door)
    await rec.start()
    assert svc.bus.subscribed == [subjects.CONN_ADVISORIES]
    r = Rig(svc, rec, running(svc))
    await r.wake(svc.now)
    try:
        yield r
    finally:
        await svc.stop()


async def test_a_dead_agents_unfinished_tasks_are_placed_again() -> None:
    """x dies: b and c, unfinished there, are detached from it (the placer finds them with no
    agent and no token) and placed anew, everything else fixed; a stays done, its agent
    saying it still holds its output for both. The new placements are committed, a's agent
    told where they went, the pipeline recorded, and x's incarnation remembered as having
    had them (withdrawn there should it come back)."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        await rec.recover_run(run, None, {"x"}, WHY, {"x": "i1"})
        [ask] = svc.placer.asked
        assert (ask.only, ask.exclude) == (frozenset("bc"), frozenset())
        assert ask.found == {"b": ("pending", None, 0), "c": ("pending", None, 0)}
        probed = sorted(
            (s.agent_id, s.msg.consumer) for s in svc.sent if isinstance(s.msg, FetchRequest)
        )
        assert probed == [("y", "b"), ("y", "c")]
        assert where(run) == {
            "a": ("succeeded", "y", 3), "b": ("accepted", "z", 101), "c": ("accepted", "z", 102)
        }  # fmt: skip
        assert run.detached == {} and run.recoveries == 1
        assert svc.commits.committed == [(PID, {"b", "c"}, False, True)]
        assert svc.displaced.rerouted == [(PID, {"b": "z:cpu0", "c": "z:cpu0"})]
        assert rec.moved == {("x", "i1"): {PID: {"b", "c"}}}
        assert svc.persisted == [PID] and svc.woken == 1 and not rec.put_off(PID)
        assert svc.carried == [] and run.placement_log[-1] == f"{WHY}: re-placed b, c"


async def test_a_finished_producer_whose_output_nobody_holds_runs_again() -> None:
    """y does not answer for a's output: a runs again too, in the same re-placement."""
    async with rig(lost) as r:
        await r.rec.recover_run(r.run, None, {"x"}, WHY, {"x": "i1"})
        [ask] = r.svc.placer.asked
        assert ask.only == frozenset("abc") and ask.found["a"] == ("pending", None, 0)
        assert where(r.run)["a"] == ("accepted", "z", 101)
        assert r.svc.commits.committed == [(PID, {"a", "b", "c"}, False, True)]
        assert r.run.placement_log[-1] == f"{WHY}: re-placed b, c; re-running a (outputs lost)"


async def test_a_failed_re_placement_puts_back_and_hears_again_what_came() -> None:
    """Nothing can take b and c: they are put back on x as they were (state, agent, token),
    and b's end, sent by x before it died and heard while they were detached (stale then,
    kept), goes back through the event path (HearAgain). Nothing was committed or rerouted;
    the re-placement waits for room."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        ended = event("e3", "b", "succeeded", "x", 4)

        def heard_meanwhile(run: PipelineRun) -> None:
            assert lc.step(run, lc.Heard(ended), svc.now)[-1] == lc.Changed()

        svc.placer.fail, svc.placer.during = True, heard_meanwhile
        await rec.recover_run(run, None, {"x"}, WHY, {"x": "i1"})
        await r.settle()
        assert where(run) == AS_PLACED and run.detached == {} and run.parked == []
        assert svc.carried == [(PID, [lc.HearAgain((ended,))])]
        assert run.stale_events == 0  # heard again: not counted as stale
        assert rec.put_off(PID) and rec.moved == {}
        assert svc.commits.committed == [] and svc.displaced.rerouted == [] and run.recoveries == 0
        assert "cannot re-place b, c now (PlacementFailed" in run.placement_log[-1]
        assert svc.woken == 2  # the log says so at once; then the recovery's end


async def test_a_re_placement_put_off_is_retried_on_the_clock_until_it_fits() -> None:
    """Put off for want of room, it is tried again STUCK_RETRY_S later (not before), as the
    same recovery; once something takes the tasks, it is over."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        svc.placer.fail = True
        await rec.recover_run(run, None, {"x"}, WHY, {"x": "i1"})
        failed_at = svc.now
        await r.wake(failed_at + STUCK_RETRY_S * 0.9)
        assert len(svc.placer.asked) == 1  # not due yet
        await r.wake(failed_at + STUCK_RETRY_S + 0.01)
        assert len(svc.placer.asked) == 2 and where(run) == AS_PLACED  # still no room
        svc.placer.fail = False
        await r.wake(failed_at + 2 * STUCK_RETRY_S + 0.02)
        assert [a.only for a in svc.placer.asked] == [frozenset("bc")] * 3
        assert where(run)["b"] == ("accepted", "z", 101) and not rec.put_off(PID)
        assert svc.commits.committed == [(PID, {"b", "c"}, False, True)]
        await r.wake(failed_at + 4 * STUCK_RETRY_S)
        assert len(svc.placer.asked) == 3  # over: not tried again


async def test_an_agent_joining_has_what_waits_for_room_tried_soon() -> None:
    """A new agent is room: what waits is tried JOIN_SETTLE_S after it joined, not at the
    next periodic retry."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        svc.placer.fail = True
        await rec.recover_run(run, None, {"x"}, WHY, {"x": "i1"})
        joined_at = svc.now + 1.0
        svc.placer.fail = False
        rec.on_advert(advert("w"), joined_at, joined=True)
        await r.wake(joined_at + JOIN_SETTLE_S * 0.5)
        assert len(svc.placer.asked) == 1
        await r.wake(joined_at + JOIN_SETTLE_S + 0.01)
        assert len(svc.placer.asked) == 2 and where(run)["c"] == ("accepted", "z", 102)


async def test_a_re_placement_that_never_fits_fails_the_pipeline() -> None:
    """No room for stuck_timeout_s: the pipeline gives up, through the state machine (told to
    its agents, closed), saying why."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        svc.placer.fail = True
        await rec.recover_run(run, None, {"x"}, WHY, {"x": "i1"})
        await r.wake(svc.now + rec.stuck_timeout_s * 0.9)
        assert not run.terminal
        await r.wake(svc.now + rec.stuck_timeout_s * 0.2)
        assert run.state == "failed" and "no agent could take its tasks for 300 s" in run.reason
        assert [type(e) for _, es in svc.carried for e in es] == [
            lc.CancelOnAgents, lc.Close, lc.Changed
        ]  # fmt: skip
        assert not rec.put_off(PID)


async def test_a_task_its_agent_gave_up_runs_again_elsewhere() -> None:
    """x cancels c itself (draining): the state machine asks for it to run again, and
    `run_again` places just c anew, b staying where it runs."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        effects = lc.step(run, lc.Heard(event("e3", "c", "cancelled", "x", 5)), svc.now)
        [again] = [e for e in effects if isinstance(e, lc.RunAgain)]
        rec.run_again(run, again.task_id, again.why)
        await r.settle()
        [ask] = svc.placer.asked
        assert ask.only == frozenset("c") and ask.found == {"c": ("pending", None, 0)}
        assert where(run)["b"] == ("started", "x", 4) and where(run)["c"] == ("accepted", "z", 101)
        assert svc.commits.committed == [(PID, {"c"}, False, True)]


async def test_a_success_is_committed_as_the_tasks_result_once() -> None:
    """Each success is written to the result ledger's bucket once: the same event again, or
    another run of the task, is counted as dropped, never written over the first."""
    async with rig() as r:
        rec, run = r.rec, r.run
        first = event("e1", "a", "succeeded", "y", 3)
        rec.commit_result(run, first)
        rec.commit_result(run, first)
        await rec.settle(PID)
        assert (run.results_committed, run.results_dropped) == (1, 1)
        rec.commit_result(run, event("e9", "a", "succeeded", "z", 9))  # a run after it
        await rec.settle(PID)
        assert (run.results_committed, run.results_dropped) == (1, 2)
        assert rec.stats["results_rerun"] == 1
        assert rec.ledger is not None
        bucket = r.svc.js.buckets[subjects.RESULTS_BUCKET]
        assert bucket.written == [f"{PID}.0"]  # one write, the first


async def test_a_dead_agent_that_comes_back_is_told_to_drop_what_moved_away() -> None:
    """Driven by the loop alone: x's heartbeats stop, it is judged dead by the clock and its
    tasks are placed again; when it turns up again as the same incarnation, it is told to
    cancel them."""
    async with rig() as r:
        svc, rec, run = r.svc, r.rec, r.run
        rec.on_advert(advert("x"), svc.now)
        await r.wake(svc.now + 3 * 60.0 + 1.0)  # three beats missed
        assert where(run)["b"] == ("accepted", "z", 101) and rec.health.is_dead("x")
        assert rec.moved == {("x", "i1"): {PID: {"b", "c"}}}
        assert svc.cluster_changed.is_set()
        rec.on_advert(advert("x"), svc.now)  # back, the same incarnation
        await r.settle()
        cancel = CancelCommand(
            pipeline_id=PID, reason="re-placed while this agent was unreachable",
            task_ids=["b", "c"],
        )  # fmt: skip
        assert Sent(subjects.cancel("x"), "x", cancel, asked=False) in svc.sent
        assert rec.moved == {}
