"""The stall watchdog driven through its door by a stand-in service (tests/unit/doors.py):
which tasks it finds overdue or stalled, what it asks their agents and when, and what it
hands to commits and recovery, look by look, with the clock moved by hand. No NATS."""

from __future__ import annotations

from orchestrator.ports import WatchdogDoor
from orchestrator.reliability.watchdog import OVERDUE_FACTOR, STARVED_AFTER_LOOKS, Watchdog
from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.api import TaskState
from schemas.base import WireModel
from schemas.pipeline import PipelineSpec
from schemas.placement import JobQuery, JobReply
from tests.unit.doors import Sent, WatchdogService

PID = "p1"
START = 1000.0  # the stand-in's monotonic clock when the plan was committed
STALL_S = 10.0
PREDICTED_S = 1.0
#: How far into the run a task started at 0 and predicted PREDICTED_S becomes overdue.
OVERDUE_AT = STALL_S + OVERDUE_FACTOR * PREDICTED_S


def holds(subject: str, agent_id: str, msg: WireModel) -> WireModel:
    """An agent that holds every job it is asked about."""
    assert subject == subjects.job(agent_id) and isinstance(msg, JobQuery)
    return JobReply(pipeline_id=msg.pipeline_id, task_id=msg.task_id, state="held")


def service(tasks: dict[str, tuple[TaskState, float | None]]) -> tuple[WatchdogService, Watchdog]:
    """One pipeline committed at START whose tasks (independent, each on agent x's cpu0,
    token 2, planned to start at the run's time zero) are in the given (state, started)."""
    svc = WatchdogService(now=START, answer=holds)
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": t, "run": {"kind": "synthetic", "seconds": PREDICTED_S}} for t in tasks
    ]})  # fmt: skip
    run = PipelineRun(PID, spec, START)
    run.state, run.committed_at = "running", START
    for tid, (state, started) in tasks.items():
        tr = run.tasks[tid]
        tr.state, tr.started_s, tr.predicted_s = state, started, PREDICTED_S
        tr.agent_id, tr.device_id, tr.token = "x", "cpu0", 2
        run.placements[tid] = Placement(tid, "x:cpu0", 0, 0.0, PREDICTED_S)
    svc.pipelines[PID] = run
    door: WatchdogDoor = svc  # mypy: the stand-in opens the watchdog's door
    return svc, Watchdog(door, stall_s=STALL_S)


def query(tid: str) -> Sent:
    q = JobQuery(pipeline_id=PID, task_id=tid, device_id="cpu0", token=2)
    return Sent(subjects.job("x"), "x", q, asked=True)


async def look(svc: WatchdogService, dog: Watchdog) -> list[Sent]:
    """One look, and what it spawned run to its end; returns what was sent meanwhile."""
    before = len(svc.sent)
    await dog.look()
    await svc.settle()
    return svc.sent[before:]


async def test_an_overdue_started_task_is_asked_about_and_an_ended_one_is_not() -> None:
    """A started task past STALL_S plus OVERDUE_FACTOR times its prediction, its end never
    heard: its events are read again at once, and its agent asked about its job under its
    token STARVED_AFTER_LOOKS looks later, then every STARVED_AFTER_LOOKS looks. A task that
    ended, or started recently, is never asked about; nothing is before it is overdue."""
    svc, dog = service({
        "late": ("started", 0.0),
        "ended": ("succeeded", 0.0),
        "recent": ("started", OVERDUE_AT - 1.0),
    })  # fmt: skip
    svc.now = START + OVERDUE_AT - 0.1
    assert await look(svc, dog) == [] and svc.failover.replayed == []  # not overdue yet
    svc.now = START + OVERDUE_AT + 0.1
    sent = [await look(svc, dog) for _ in range(1 + 2 * STARVED_AFTER_LOOKS)]
    asked_at = [n for n, s in enumerate(sent) if s]
    assert asked_at == [STARVED_AFTER_LOOKS, 2 * STARVED_AFTER_LOOKS]
    assert sent[STARVED_AFTER_LOOKS] == sent[2 * STARVED_AFTER_LOOKS] == [query("late")]
    assert svc.failover.replayed == [PID]  # once: not again within STALL_S
    assert dog.job_answers == {"held": 2} and dog.asking == 0
    assert svc.commits.committed == [] and svc.recovery.starved == []


async def test_a_stalled_task_is_committed_again_then_asked_then_handed_to_recovery() -> None:
    """A task free to start and not started for STALL_S: its commit is sent again (no look
    of its own), the pipeline's events read again and, as they say nothing of it, its agent
    asked about it (once per placement, though its events are read again at later looks);
    still not started STARVED_AFTER_LOOKS looks later, it goes to recovery as starved, once."""
    svc, dog = service({"idle": ("accepted", None)})
    svc.now = START + STALL_S + 0.1
    assert await look(svc, dog) == [query("idle")]
    assert svc.failover.replayed == [PID]
    assert svc.commits.committed == [(PID, {"idle"}, False, False)]
    for _ in range(STARVED_AFTER_LOOKS):
        svc.now += STALL_S + 0.1  # its events are due to be read again
        assert await look(svc, dog) == []  # asked once per placement
    assert svc.failover.replayed == (1 + STARVED_AFTER_LOOKS) * [PID]
    assert svc.commits.committed == (1 + STARVED_AFTER_LOOKS) * [(PID, {"idle"}, False, False)]
    assert svc.recovery.starved == [(PID, {"idle"})]
    await look(svc, dog)
    assert svc.recovery.starved == [(PID, {"idle"})]  # handed over once


async def test_a_stalled_task_whose_start_the_events_held_is_not_asked_about() -> None:
    """The events read again say it started: its agent is not asked."""
    svc, dog = service({"idle": ("accepted", None)})

    def found_started(run: PipelineRun) -> None:
        run.tasks["idle"].state = "started"

    svc.failover.on_replay = found_started
    svc.now = START + STALL_S + 0.1
    assert await look(svc, dog) == []
    assert svc.failover.replayed == [PID] and svc.commits.committed == [
        (PID, {"idle"}, False, False)
    ]


async def test_nothing_is_judged_while_behind_on_events_or_for_a_pipeline_not_ours() -> None:
    """Behind on task events the look is skipped; a pipeline this replica may not act for
    is not looked at."""
    svc, dog = service({"late": ("started", 0.0), "idle": ("accepted", None)})
    svc.now = START + 100 * OVERDUE_AT
    svc.behind = True
    assert await look(svc, dog) == [] and dog.skipped == 1
    svc.behind = False
    svc.failover.not_ours.add(PID)
    assert await look(svc, dog) == [] and dog.skipped == 1
    assert svc.failover.replayed == [] and svc.commits.committed == []


async def test_an_overdue_task_whose_end_is_heard_before_its_agent_is_asked_is_not() -> None:
    """The look that finds a task due to be asked about spawns the ask; its end heard
    before the ask goes out, the agent is not asked."""
    svc, dog = service({"late": ("started", 0.0)})
    svc.now = START + OVERDUE_AT + 0.1
    for _ in range(STARVED_AFTER_LOOKS):
        assert await look(svc, dog) == []
    await dog.look()  # due to be asked now
    svc.pipelines[PID].tasks["late"].state = "succeeded"
    await svc.settle()
    assert svc.sent == [] and dog.asking == 0
