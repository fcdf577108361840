"""A started task whose end the orchestrator never heard, not even from the events stream:
the watchdog asks its agent about the job (`JobQuery`) over a real nats-server. An end event
lost before the stream (dropped by a full journal while offline) used to hold its pipeline
open for ever: every replay found nothing, and nothing else was done."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.core import Job
from edge_agent.executors import Output
from orchestrator.infra import procs
from orchestrator.placement import commits
from orchestrator.reservations.store import BookingStore, device_key
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.codec import decode, headers_for
from schemas.events import TaskEvent, TaskEventState
from schemas.placement import CommitCommand, JobQuery
from tests.harness import (
    EMULATED_CPU,
    RecordingAgent,
    agent_config,
    start_cluster,
    stop_cluster,
)
from tests.integration.test_failover import EventTap, adopted_after_kill, configs
from tests.integration.test_offline import Proxy
from tests.integration.test_recovery import start_victim
from tests.integration.test_stall import one_agent, run_to_end
from transport.client import Client
from transport.rpc import settle

pytestmark = pytest.mark.integration

STALL_S = 0.4


def one_task(seconds: float) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {"name": "p", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": seconds}}]}
    )


def lose_first_end(agent: RecordingAgent) -> list[str]:
    """The first end event of task t is lost before the stream (as a full journal drops one
    while offline); its id is listed. Everything else is sent as usual."""
    real = agent.outbox.emit
    lost: list[str] = []

    def emit(subject: str, key: str, data: bytes) -> None:
        ev = decode(data, TaskEvent)
        if ev.task_id == "t" and ev.state == "succeeded" and not lost:
            lost.append(key)
            return
        real(subject, key, data)

    agent.outbox.emit = emit  # type: ignore[method-assign]
    return lost


def forget_first_end(agent: RecordingAgent) -> None:
    """The agent keeps no record of task t's first end (nothing to send again)."""
    real = agent.core.remember_end
    seen: list[str] = []

    def remember(
        key: tuple[str, str], token: int, subject: str, event_id: str, data: bytes
    ) -> None:
        if key[1] == "t" and not seen:
            seen.append(event_id)
            return
        real(key, token, subject, event_id, data)

    agent.core.remember_end = remember  # type: ignore[method-assign]


def slow_first_run(agent: RecordingAgent, extra_s: float) -> None:
    """Task t's first run takes `extra_s` longer than its spec says (and than predicted)."""
    runs: list[str] = []

    async def slow(job: Job) -> None:
        if job.offer.task.id == "t" and not runs:
            runs.append(job.offer.pipeline_id)
            await asyncio.sleep(extra_s)  # the task's own (emulated) run time, not a wait

    agent.before_run = slow


def lose_jobs_at_first_commit(agent: RecordingAgent) -> dict[str, int]:
    """The jobs of the first commit that reaches the agent are gone from it as it arrives (as
    with a process restarted where its owner could not see it): task -> token lost."""
    real = agent.core.commit
    lost: dict[str, int] = {}
    first: list[bool] = []

    def commit(cmd: CommitCommand) -> int:
        if first:
            return real(cmd)
        first.append(True)
        for t, token in cmd.token_of().items():  # (the jobs held the provisional offers' 0)
            if agent.core.jobs.pop((cmd.pipeline_id, t), None) is not None:
                lost[t] = token
        return 0

    agent.core.commit = commit  # type: ignore[method-assign]
    return lost


async def test_a_stalled_task_its_agent_lost_is_placed_again_once_asked(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t's agent no longer holds its job (booking_stress, seed 421: the fleet's process
    restarted while the server was away, then t's owner died; its adopter could not tell).
    The commit sent again for the stalled task finds nothing; asked at the same look, the
    agent reports it cancelled and it is placed again at once, not two looks later as
    starved. (The look after the commit, which would find it first, is put off here: this
    is the watchdog's own ask, for a loss after that look.)"""
    monkeypatch.setattr(commits, "COMMIT_CONFIRM_S", 60.0)
    async with one_agent(nats_url, stall_s=2.0) as (orch, agent, _):
        lost = lose_jobs_at_first_commit(agent)
        run = await run_to_end(orch, one_task(0.05))
        assert list(lost) == ["t"]
        assert orch.watchdog.job_answers == {"gone": 1}
        said = f"t stalled, asked {agent.agent_id} about token {lost['t']}: holds no such job"
        assert [x for x in run.placement_log if x.startswith(said)], run.placement_log
        assert not [x for x in run.placement_log if "starved" in x], run.placement_log
        assert run.tasks["t"].token > lost["t"]  # placed again
        assert [e[1] for e in agent.log] == ["t"]  # and run once, there


async def test_a_short_tasks_end_lost_before_the_stream_is_sent_again_when_asked(
    nats_url: str,
) -> None:
    """A task too short to report its start (its end is its only event), that end lost
    before the stream: its agent keeps that end too, so, asked once the events read again
    say nothing of it, it says `ended` and sends the end again; the task runs once. (Before,
    short tasks' ends were not kept: the agent said `gone`, and a task that had finished was
    placed and run again; a look at a commit racing a short task's end did the same.)"""
    async with one_agent(nats_url, stall_s=2.0) as (orch, agent, _):
        lost = lose_first_end(agent)
        run = await run_to_end(orch, one_task(0.01))
        assert lost
        assert orch.watchdog.job_answers == {"ended": 1}
        assert run.state == "succeeded" and run.recoveries == 0, run.placement_log
        assert [e[1] for e in agent.log] == ["t"]


async def test_an_agent_that_lost_a_stalled_job_is_asked_about_the_pipelines_others(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """t and u (fed by t) are both on the agent that lost their jobs: asked about stalled t,
    it says `gone`, and is asked at once about u, queued there waiting for t's output: gone
    too, and placed again with t, not a stall time after t ends (found stalled in turn)."""
    chained = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "t", "run": {"kind": "synthetic", "seconds": 0.05}},
        {"id": "u", "run": {"kind": "synthetic", "seconds": 0.05}, "deps": ["t"]},
    ]})  # fmt: skip
    monkeypatch.setattr(commits, "COMMIT_CONFIRM_S", 60.0)  # (as in the test above)
    async with one_agent(nats_url, stall_s=2.0) as (orch, agent, _):
        lost = lose_jobs_at_first_commit(agent)
        run = await run_to_end(orch, chained)
        assert sorted(lost) == ["t", "u"]
        assert orch.watchdog.job_answers == {"gone": 2}
        said = f"u waiting, asked {agent.agent_id} about token {lost['u']}: holds no such job"
        assert [x for x in run.placement_log if x.startswith(said)], run.placement_log
        assert not [x for x in run.placement_log if "stalled, commit sent again: u" in x]
        assert [e[1] for e in agent.log] == ["t", "u"]


async def test_an_end_event_lost_before_the_stream_is_sent_again_when_asked(
    nats_url: str,
) -> None:
    async with one_agent(nats_url, stall_s=STALL_S) as (orch, agent, _):
        lost = lose_first_end(agent)
        run = await run_to_end(orch, one_task(0.1))
        assert lost  # the end really was lost
        assert orch.watchdog.job_answers == {"ended": 1}
        assert [x for x in run.placement_log if "its end event is sent again" in x]
        assert run.recoveries == 0  # not run again: its own end came
        assert [e[1] for e in agent.log] == ["t"]


async def test_a_started_job_its_agent_no_longer_holds_is_placed_again(nats_url: str) -> None:
    async with one_agent(nats_url, stall_s=STALL_S) as (orch, agent, _):
        lost = lose_first_end(agent)
        forget_first_end(agent)
        run = await run_to_end(orch, one_task(0.1))
        assert lost
        assert orch.watchdog.job_answers == {"gone": 1}
        log = run.placement_log
        assert [x for x in log if "holds no such job" in x]
        assert [x for x in log if "cancelled t itself" in x and "re-placed t" in x]
        assert run.recoveries == 1
        assert [e[1] for e in agent.log] == ["t", "t"]  # ran again, under a new token
        assert run.tasks["t"].token > 0


async def test_a_job_still_running_is_left_to_run(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="mars"):
        async with one_agent(nats_url, stall_s=STALL_S) as (orch, agent, _):
            slow_first_run(agent, extra_s=8 * STALL_S)  # overdue long before it ends
            run = await run_to_end(orch, one_task(0.1))
            answers = orch.watchdog.job_answers
            assert answers.get("held", 0) >= 2 and set(answers) == {"held"}
            # asked every two looks while it ran, said once
            assert len([x for x in run.placement_log if "holds it: left to run" in x]) == 1
            assert run.recoveries == 0
            assert [e[1] for e in agent.log] == ["t"]
    # the orchestrator's stop sums up what agents were asked
    said = f"agents asked about stalled or overdue tasks: held {orch.watchdog.job_answers['held']}"
    assert [r for r in caplog.records if r.getMessage() == said]


async def test_a_job_offered_and_not_committed_yet_is_held_under_its_commits_token(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first round's offers are provisional (token 0) until the commit brings the tokens.
    Asked about such a job before its commit came (t's commit lost here, the look after it
    far off), the agent says it holds it, as a commit under that token would start it; then
    the commit comes and t runs, once, where it was placed. Before, the agent said `gone` and
    t was placed again for nothing (a commit backing off while its agent reconnected, asked
    about by the watchdog meanwhile)."""
    monkeypatch.setattr(commits, "COMMIT_CONFIRM_S", 60.0)
    async with one_agent(nats_url, stall_s=60.0) as (orch, agent, _):
        commit, lost = agent.core.commit, asyncio.Event()

        def lose(cmd: CommitCommand) -> int:
            lost.set()
            return 0

        agent.core.commit = lose  # type: ignore[method-assign]
        await orch.submit_spec(one_task(0.01), "p")
        run = orch.pipelines["p"]
        token = run.tasks["t"].token
        await asyncio.wait_for(lost.wait(), 5.0)
        agent.core.commit = commit  # type: ignore[method-assign]
        assert agent.core.jobs[("p", "t")].offer.token == 0  # held, provisionally
        await orch.watchdog.ask_about(run, ["t"], "unstarted")
        assert orch.watchdog.job_answers == {"held": 1}
        await orch.commits.commit_all(run, {"t"})
        done = await orch.wait_terminal("p", 10.0)
        assert done.state == "succeeded", done.reason
        assert done.tasks["t"].token == token and done.recoveries == 0  # never placed again
        assert [e[1] for e in agent.log] == ["t"]


async def test_an_agent_from_before_job_queries_is_left_alone(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with one_agent(nats_url, stall_s=STALL_S) as (orch, agent, _):
        job_subject = subjects.job(agent.agent_id)
        for sub in [s for s in agent._subs if s.subject == job_subject]:
            await sub.unsubscribe()  # as an agent of an older release: nobody answers
        slow_first_run(agent, extra_s=8 * STALL_S)
        with caplog.at_level(logging.WARNING, logger="mars"):
            run = await run_to_end(orch, one_task(0.1))
        answers = orch.watchdog.job_answers
        assert answers.get("no_responders", 0) >= 1 and set(answers) == {"no_responders"}
        said = [r for r in caplog.records if "does not answer job queries" in r.getMessage()]
        assert len(said) == 1  # once per agent, not per ask
        assert run.recoveries == 0


async def test_an_answer_that_does_not_decode_leaves_the_task_alone(nats_url: str) -> None:
    """A reply this release cannot read (a later release's state, say) is no answer: the
    task is left where it runs, and the watchdog goes on."""
    async with one_agent(nats_url, stall_s=STALL_S) as (orch, agent, _):
        assert agent.nc is not None
        for sub in [s for s in agent._subs if s.subject == subjects.job(agent.agent_id)]:
            await sub.unsubscribe()
        nc = agent.nc

        async def future_reply(msg: Msg) -> None:
            q = decode(msg.data, JobQuery)
            body = {"pipeline_id": q.pipeline_id, "task_id": q.task_id, "state": "paused"}
            await nc.publish(msg.reply, json.dumps(body).encode(), headers=headers_for("json"))

        agent._subs.append(await nc.subscribe(subjects.job(agent.agent_id), cb=future_reply))
        await settle(nc)
        slow_first_run(agent, extra_s=8 * STALL_S)
        run = await run_to_end(orch, one_task(0.1))
        answers = orch.watchdog.job_answers
        assert answers.get("no_answer", 0) >= 1 and set(answers) == {"no_answer"}
        assert run.recoveries == 0
        assert [e[1] for e in agent.log] == ["t"]


class GatedFleetAgent(RecordingAgent):
    """A real agent whose tasks all wait for the test's go once started, and which counts the
    end events handed to its outbox."""

    def __init__(self, *a: Any, tasks: int, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.tasks = tasks
        self.gate = asyncio.Event()
        self.all_in = asyncio.Event()
        self.all_ended = asyncio.Event()
        self.entered = 0
        self.ends = 0

    async def _run(self, job: Job) -> Output:
        self.entered += 1
        if self.entered == self.tasks:
            self.all_in.set()
        await self.gate.wait()
        return await super()._run(job)

    def _emit(self, job: Job, state: TaskEventState, **kw: Any) -> None:
        super()._emit(job, state, **kw)
        if state == "succeeded":
            self.ends += 1
            if self.ends == self.tasks:
                self.all_ended.set()


async def test_ends_a_full_journal_dropped_offline_are_sent_again_when_asked(
    nats_url: str, nats_server: Any, tmp_path: Path
) -> None:
    """The case itself, nothing injected: an agent cut off from NATS (a TCP proxy) while its
    tasks end journals their end events until its journal's byte bound, and drops the rest
    (offline, not even sent best-effort). Back online, the journaled ends are delivered; the
    dropped ones reach the orchestrator only because the watchdog asks about their jobs."""
    n = 24
    syn = {"kind": "synthetic", "mode": "sleep", "seconds": 0.01}
    spec = PipelineSpec.model_validate(
        {"name": "lost", "tasks": [{"id": f"t{i}", "run": syn} for i in range(n)]}
    )
    proxy = Proxy(nats_server.port)
    await proxy.open()
    orch = Orchestrator(nats_url, stall_s=2.0)  # no job asked about while it is cut off
    await orch.start()
    config = agent_config(
        "s", "edge", probe_cpu=False, devices=[{**EMULATED_CPU, "slots": n}],
        buffer_dir=str(tmp_path / "buf"), buffer_max_bytes=4096,  # the bound allowed
        reconnect_base_s=0.05, reconnect_max_s=0.2, started_event_after_s=0,
    )  # fmt: skip
    agent = GatedFleetAgent(proxy.url, config, agent_id="edge-1", calibrate=False, tasks=n)
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, 10.0) == 1
        await orch.submit_spec(spec, pipeline_id="lost-1")
        run = orch.pipelines["lost-1"]
        async with asyncio.timeout(10):
            await agent.all_in.wait()
        await orch.wait_for(lambda: all(t.state == "started" for t in run.tasks.values()), 10)
        assert await agent.outbox.wait_empty(5.0)
        before = agent.outbox.dropped  # starts past the bound, sent best-effort while online
        await proxy.cut()
        async with asyncio.timeout(10):
            await agent.offline.wait()
        agent.gate.set()  # every task ends while the agent is cut off
        async with asyncio.timeout(10):
            await agent.all_ended.wait()
        dropped = agent.outbox.dropped - before
        assert 0 < dropped < n  # some journaled, the rest lost for good
        assert len(agent.outbox.journal) == n - dropped
        await proxy.open()
        run = await orch.wait_terminal("lost-1", 30.0)
        assert run.state == "succeeded", run.reason
        assert orch.watchdog.job_answers == {"ended": dropped}  # each asked, and sent again
        assert run.recoveries == 0
        assert sorted(e[1] for e in agent.log) == sorted(t.id for t in spec.tasks)  # ran once
    finally:
        await agent.stop()
        await orch.stop()
        await proxy.close()


async def test_an_adopter_asks_about_a_started_task_of_the_dead_owner(
    nats_url: str, tmp_path: Path
) -> None:
    """Its owner SIGKILLed while t runs, and t's end lost before the stream: the replica that
    adopts the pipeline reads t's start from the stream and asks t's agent, named by the dead
    owner's records, whether it holds t (t has ended by then): it sends t's end again."""
    with (tmp_path / "orchestrator.log").open("wb") as log:
        proc = procs.spawn(["-v", "orchestrator", "--nats", nats_url], log=log)
    agent = RecordingAgent(nats_url, configs(1)["ag0"], agent_id="ag0", calibrate=False)
    lost = lose_first_end(agent)
    client = await Client.connect(nats_url)
    tap, survivor = EventTap(), None
    try:
        await agent.start()
        assert await client.wait_for_agents(1, timeout=30.0) == 1  # the doomed replica alone
        await tap.start(nats_url, "adopted-1")
        reply = await client.submit(one_task(1.0), pipeline_id="adopted-1")
        assert reply.state == "running"
        survivor = Orchestrator(nats_url, name="survivor", stall_s=STALL_S)
        run = await adopted_after_kill(proc, survivor, 1, tap, "t", "adopted-1")
        assert run.state == "succeeded", run.reason
        assert run.owner == "survivor" and survivor.failover.adopted == 1
        assert lost  # the end never reached the stream by itself
        assert survivor.watchdog.job_answers == {"ended": 1}
        assert [e[1] for e in agent.log] == ["t"]  # not run again
    finally:
        procs.stop_all([proc])
        await tap.close()
        await client.close()
        await agent.stop()
        if survivor is not None:
            await survivor.stop()


async def test_an_adopter_asks_about_a_started_task_its_agent_lost_unseen(
    nats_url: str, tmp_path: Path
) -> None:
    """t runs on the victim when its owner is SIGKILLed, and then the victim's process too,
    which comes back at once (a new incarnation, holding no job). The dead owner's record
    names the victim, not the incarnation, and the victim is alive: nothing says t is lost.
    The replica that adopts the pipeline asks the victim about t at once: `gone`, so t is
    placed again then, not when the watchdog finds it overdue, far past its prediction, and
    asks two looks later (`booking_stress --kill-after 10 --restart-agents-after 10`, seed
    650: a 25.1 s pipeline)."""
    with (tmp_path / "orchestrator.log").open("wb") as log:
        owner = procs.spawn(["-v", "orchestrator", "--nats", nats_url], log=log)
    victim = start_victim(nats_url, tmp_path, "victim")
    client = await Client.connect(nats_url)
    tap, survivor = EventTap(), None
    try:
        assert await client.wait_for_agents(1, timeout=30.0) == 1  # the doomed replica alone
        await tap.start(nats_url, "lost-run-1")
        reply = await client.submit(one_task(3.0), pipeline_id="lost-run-1")
        assert reply.state == "running"
        await tap.wait("t", "started")
        for proc in (owner, victim):  # neither says a word
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        victim = start_victim(nats_url, tmp_path, "victim")  # back, as a new incarnation
        survivor = Orchestrator(nats_url, name="survivor")
        await survivor.start()
        run = await survivor.wait_terminal("lost-run-1", 30.0)
        assert run.state == "succeeded", run.reason
        assert run.owner == "survivor" and survivor.failover.adopted == 1
        said = "t adopted, asked victim about token "
        assert [x for x in run.placement_log if x.startswith(said) and "holds no such job" in x]
        assert survivor.watchdog.job_answers == {"gone": 1}
        assert [x for x in run.placement_log if "victim cancelled t itself" in x]  # placed again
    finally:
        procs.stop_all([owner, victim])
        await tap.close()
        await client.close()
        if survivor is not None:
            await survivor.stop()


async def test_a_task_left_queued_when_its_window_is_found_gone_is_asked_about(
    nats_url: str,
) -> None:
    """c waits on b for the output of p, which runs on a, when c's window is found gone from
    b's key with no notice heard (a lease lapsed while the server was away), and b no longer
    holds c's job (its process restarted in the outage). c cannot move (its input is on its
    way), so it stays queued; its agent is asked about it at once, says `gone`, and c is
    placed again before p even ends, not when the stall watchdog (30 s here) finds it
    (booking_stress seed 513: a 12.7 s pipeline)."""
    chained = PipelineSpec.model_validate({"name": "q", "tasks": [
        {"id": "p", "run": {"kind": "synthetic", "seconds": 1.5},
         "requires": {"pinned_agent": "a"}},
        {"id": "c", "run": {"kind": "synthetic", "seconds": 0.05}, "deps": ["p"],
         "requires": {"pinned_agent": "b"}},
    ]})  # fmt: skip
    cfg = {"a": agent_config("s", "edge"), "b": agent_config("s", "edge")}
    # a renewal, and an audit of the windows, every 0.2 s
    orch, agents = await start_cluster(nats_url, cfg, lease_s=0.6, stall_s=30.0)
    b = next(x for x in agents if x.agent_id == "b")
    nc = await nats.connect(nats_url)
    try:
        await orch.submit_spec(chained, "q1")
        run = orch.pipelines["q1"]
        token = run.tasks["c"].token
        await orch.wait_for(lambda: run.tasks["p"].state == "started", 5)
        assert run.tasks["c"].state == "accepted" and run.tasks["c"].agent_id == "b"
        b.core.jobs.pop(("q1", "c"), None)  # gone with b's process, unseen
        other = BookingStore(nc.jetstream())
        await other.start()
        await other.release(device_key("b", "cpu0"), "q1", time.time(), ["c"])  # nobody told
        await other.stop()
        await orch.wait_for(lambda: run.tasks["c"].token > token, 5)
        assert run.tasks["p"].state == "started"  # placed again while p still runs
        said = f"c unbooked, asked b about token {token}: holds no such job"
        assert [x for x in run.placement_log if x.startswith(said)], run.placement_log
        assert [x for x in run.placement_log if "c already have data in flight" in x]
        assert orch.watchdog.job_answers == {"gone": 1}
        done = await orch.wait_terminal("q1", 10)
        assert done.state == "succeeded"
        assert [e[1] for e in b.log] == ["c"]  # run once, under its new token
    finally:
        await nc.close()
        await stop_cluster(orch, agents)
