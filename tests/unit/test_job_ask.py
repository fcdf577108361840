"""What the watchdog asks an agent about, and only that: no NATS here, a stand-in
connection that records the requests and answers them as an agent would."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from benchmarks.watchdog_look import NOW, idle_orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas.codec import decode, encode, headers_for
from schemas.placement import JobHeld, JobQuery, JobReply


@dataclass
class Reply:
    data: bytes
    headers: dict[str, str]


@dataclass
class Recorder:
    """Answers every job query `answer`, and keeps them."""

    answer: JobHeld = "held"
    asked: list[tuple[str, JobQuery]] = field(default_factory=list)
    max_payload: int = 1 << 20  # what a connection says its server takes

    async def request(self, subject: str, data: bytes, **_: Any) -> Reply:
        q = decode(data, JobQuery)
        self.asked.append((subject, q))
        rep = JobReply(pipeline_id=q.pipeline_id, task_id=q.task_id, state=self.answer)
        return Reply(encode(rep), headers_for("msgpack"))


async def test_only_a_task_still_started_is_asked_about_under_its_current_token() -> None:
    o, _ = idle_orchestrator(1)
    run = o.pipelines["p0"]
    started = sorted(t for t, tr in run.tasks.items() if tr.state == "started")
    assert len(started) >= 2
    nc = Recorder()
    o.nc = nc  # type: ignore[assignment]
    first, second = started[:2]
    run.tasks[second].state = "succeeded"  # its end heard between the look and the ask
    run.tasks[first].token = 7  # placed again meanwhile: asked under the new token
    o.watchdog.asking = 2  # as the look that chose them counted them
    await o.watchdog._ask_agents(run, [first, second], "overdue")
    assert o.watchdog.asking == 0  # given back, answered or not
    assert [(s, q.task_id, q.token, q.device_id) for s, q in nc.asked] == [
        ("mars.v1.agents.a.cmd.job", first, 7, "cpu0")
    ]
    assert o.watchdog.job_answers == {"held": 1}


async def test_after_its_events_are_read_again_a_task_still_stalled_is_asked_about() -> None:
    """A stalled task's agent is asked whether it holds the job once the pipeline's events
    have been read again, and only if they said nothing of it: asked before, the agent of a
    short task that had run (its end only in the stream) answered `gone` and it ran again."""
    o, _ = idle_orchestrator(2)
    run = o.pipelines["p1"]  # its ninth task free to start and never started
    (stalled,) = run.stalled(NOW, o.watchdog.stall_s)
    found: list[str] = []

    async def replay(r: PipelineRun) -> int:
        for t in found:  # the stream held its end
            r.tasks[t].state = "succeeded"
        return len(found)

    o.failover.replay = replay  # type: ignore[method-assign,assignment]
    nc = Recorder()
    o.nc = nc  # type: ignore[assignment]
    token = run.tasks[stalled].token
    found.append(stalled)
    await o.watchdog._replay(run, {stalled: token})
    assert nc.asked == [] and o.watchdog.asking == 0  # its end was in the stream
    run.tasks[stalled].state = "accepted"
    found.clear()
    await o.watchdog._replay(run, {stalled: token + 1})  # placed again since the look
    assert nc.asked == []
    await o.watchdog._replay(run, {stalled: token})
    assert [(q.task_id, q.token) for _, q in nc.asked] == [(stalled, token)]
    assert o.watchdog.job_answers == {"held": 1} and o.watchdog.asking == 0
    assert run.placement_log[-1] == (
        f"{stalled} stalled, asked a about token {token}: holds it: left to run"
    )


async def test_an_agent_that_lost_a_stalled_job_is_asked_about_each_other_task_once() -> None:
    """Answered `gone` about stalled tasks, an agent is asked about the pipeline's other
    tasks queued on it: each once, however many of its stalled tasks it said `gone` about."""
    o, _ = idle_orchestrator(2)
    run = o.pipelines["p1"]
    queued = sorted(t for t, tr in run.tasks.items() if tr.state == "accepted")
    assert len(queued) >= 4  # the stalled one, and others waiting for inputs
    nc = Recorder(answer="gone")
    o.nc = nc  # type: ignore[assignment]
    o.watchdog.asking = 2
    await o.watchdog._ask_agents(run, queued[:2], "stalled")
    asked = [q.task_id for _, q in nc.asked]
    assert sorted(asked) == queued and len(asked) == len(set(asked))
    assert o.watchdog.job_answers == {"gone": len(queued)} and o.watchdog.asking == 0
    await o.watchdog.ask_about(run, queued, "stalled")  # a later replay: all asked already
    assert len(nc.asked) == len(queued) and o.watchdog.asking == 0


async def test_an_early_ask_on_a_sign_does_not_use_up_the_stall_watchdogs() -> None:
    """Asked at the look after its commit (`unstarted`) or when its window was found gone
    (`unbooked`), a task held then is asked about again when the stall watchdog finds it
    (its job may be lost in between); the watchdog's own ask is made once per placement."""
    o, _ = idle_orchestrator(2)
    run = o.pipelines["p1"]
    (task,) = run.stalled(NOW, o.watchdog.stall_s)
    nc = Recorder()
    o.nc = nc  # type: ignore[assignment]
    for kind in ("unstarted", "unbooked", "stalled", "stalled"):
        await o.watchdog.ask_about(run, [task], kind)
    assert [q.task_id for _, q in nc.asked] == [task] * 3
    assert o.watchdog.job_answers == {"held": 3} and o.watchdog.asking == 0
    assert not [x for x in run.placement_log if "unstarted" in x or "unbooked" in x]  # quiet


async def test_an_agent_that_says_it_ran_a_task_not_ended_here_has_the_events_read_again() -> None:
    """The agent ran the task and its end went to the stream (its journal saw it delivered,
    so it is not sent again), but this replica never applied it: the pipeline's events are
    read again at once, not a stall time later."""
    o, _ = idle_orchestrator(1)
    run = o.pipelines["p0"]
    tid = sorted(t for t, tr in run.tasks.items() if tr.state == "started")[0]
    replayed: list[str] = []

    async def replay(r: PipelineRun) -> int:
        replayed.append(r.pipeline_id)
        r.tasks[tid].state = "succeeded"  # the stream held its end
        return 1

    o.failover.replay = replay  # type: ignore[method-assign,assignment]
    spawned: list[asyncio.Task[Any]] = []

    def spawn(coro: Any) -> asyncio.Task[Any]:
        spawned.append(asyncio.ensure_future(coro))
        return spawned[-1]

    o.spawn = spawn  # type: ignore[method-assign]
    nc = Recorder(answer="ended")
    o.nc = nc  # type: ignore[assignment]
    o.watchdog.asking = 1
    await o.watchdog._ask_agents(run, [tid], "overdue")
    await asyncio.gather(*spawned)  # the replay it spawned
    assert replayed == ["p0"] and run.tasks[tid].state == "succeeded"
    assert "p0" not in o.watchdog.replaying
