"""The stall watchdog: no pipeline is held open for ever by one lost message.

Task events reach the orchestrator on a core NATS subscription, commits are single requests.
A task free to start (committed, every input made, its planned start come) that is not
reported started within `stall_s`, or a started task whose end is not reported within
`stall_s` plus OVERDUE_FACTOR times its prediction, is logged once; the first kind's agent is
asked to start it again (commits are idempotent; a repeated one also makes the agent fetch
any input still missing), and for either the pipeline's task events
are read again from MARS_EVENTS (repeats are ignored by event id; at most MAX_REPLAYS at once).
A stalled task the events read again say nothing of has its agent asked whether it holds
the job at all (`JobQuery`, below): one it lost, e.g. with a process restarted while this
replica could not see it, is reported `cancelled` and placed again at once, not two looks
later as starved.
A started task still overdue STARVED_AFTER_LOOKS looks after that (the stream holds no end
either) has its agent asked whether it holds the job under its token (`JobQuery`), again every
STARVED_AFTER_LOOKS looks: a job still held is left to run (its executor's time limit ends
it); one that ended has its end event sent again; one the agent does not hold (its end event
lost before the stream, e.g. dropped by a full journal while offline) is reported `cancelled`
by the agent, and recovery places it again as for any task its agent gave up.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Iterator

import nats.errors

from orchestrator.ports import AskKind, WatchdogDoor
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.api import TASK_ENDED_STATES
from schemas.codec import DecodeError, RemoteError
from schemas.placement import JobQuery, JobReply

log = logging.getLogger("mars.watchdog")

#: What a job query is about: a started task `overdue`, a `stalled` one (free to start, not
#: started), one `waiting` for inputs on an agent that lost a stalled one, or one not ended
#: of a pipeline just `adopted` (its dead owner's record names agents, not incarnations), or
#: one left queued, its inputs on their way, when its window was found gone (`unbooked`), or
#: one free to start and not started at the look after its commit (`unstarted`).
#: Kinds whose ask is not the once per placement (`_ask_agents`): an overdue task is asked
#: again every few looks; an early ask on a mere sign (made once by what saw it) must not
#: keep the stall watchdog from asking later, when a job held then may be lost.
ASKED_AGAIN: frozenset[AskKind] = frozenset({"overdue", "unbooked", "unstarted"})
#: The task states a kind asks about (any other: `accepted`, waiting to start); a task found
#: in another by the time it is asked has moved on and is not asked.
ASKED_STATES: dict[AskKind, tuple[str, ...]] = {
    "overdue": ("started",),
    "adopted": ("accepted", "started"),
}
#: Kinds where `held` is the expected answer, not noted in the pipeline's log.
HELD_EXPECTED: frozenset[AskKind] = frozenset({"waiting", "adopted", "unbooked", "unstarted"})

#: Seconds a task may be free to start without starting.
STALL_S = 10.0
#: A started task is overdue after STALL_S plus this many times its predicted duration.
OVERDUE_FACTOR = 3.0
#: Asked again this many watchdog looks ago and still not started: its inputs are re-made.
#: Also: overdue (its events read again) this many looks ago and still no end: its agent is
#: asked about the job, and again every this many looks.
STARVED_AFTER_LOOKS = 2
#: Seconds to wait for an agent's answer about a job.
JOB_QUERY_TIMEOUT_S = 2.0
#: Job queries under way at once: under overload, when many tasks look overdue, the rest are
#: asked at a later look.
MAX_ASKS = 64
#: Replays of pipelines' task events under way at once (each opens a JetStream consumer): an
#: overloaded orchestrator, whose every pipeline looks stalled, is not buried under its own
#: replays; the others are due at a later look.
MAX_REPLAYS = 8
#: A look gives the event loop a turn after about this many tasks looked at (~1 ms here): with
#: thousands of live pipelines one pass held the loop for tens of ms (1,000 of 20 tasks: ~20;
#: 5,000: ~95), and every submission and task event arriving meanwhile waited behind it.
SLICE_TASKS = 1000


class Watchdog:
    def __init__(self, orch: WatchdogDoor, stall_s: float = STALL_S) -> None:
        self.o = orch
        self.stall_s = stall_s
        #: (pipeline, task, token, kind) already reported
        self._reported: set[tuple[str, str, int, str]] = set()
        #: pipeline -> when its events were last read again
        self._replayed: dict[str, float] = {}
        #: (pipeline, task, token) stalled -> looks it has stayed stalled since first seen
        self._stalled_looks: dict[tuple[str, str, int], int] = {}
        #: (pipeline, task, token) overdue -> looks it has stayed overdue since first seen
        self._overdue_looks: dict[tuple[str, str, int], int] = {}
        #: agents found not answering job queries for want of a responder (an older release)
        self._unasked: set[str] = set()
        #: What agents answered about jobs, by answer (and "no_responders", "no_answer").
        self.job_answers: Counter[str] = Counter()
        #: Job queries under way now.
        self.asking = 0
        #: (pipeline, task, token) asked about as stalled or waiting: once per placement
        self._asked: set[tuple[str, str, int]] = set()
        #: pipelines whose events are being read again now
        self.replaying: set[str] = set()
        #: Looks skipped because the orchestrator was behind on its task events.
        self.skipped = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.stall_s / 2)  # a watchdog's cadence
            await self.look()

    async def look(self) -> None:
        """`check`, with a turn of the event loop after every SLICE_TASKS tasks looked at."""
        for _ in self._looking():
            await asyncio.sleep(0)

    def check(self) -> None:
        """One look at every live pipeline this replica may act for, in one go."""
        for _ in self._looking():
            pass

    def _looking(self) -> Iterator[None]:
        """A look, pausing (yielding) after every SLICE_TASKS tasks; none while the
        orchestrator is behind on its live task events (what it knows of its tasks is that
        old: under overload every task looked stalled, and each look made more work), and
        the rest of one not after a pause that finds it so. A pipeline is judged as it is
        when its turn comes: one that ended meanwhile is skipped, one that came in meanwhile
        waits for the next look."""
        o = self.o
        if o.events_behind():
            self.skipped += 1
            log.debug("look skipped: %d task events not handled yet", o.events_backlog())
            return
        live = set()
        looks: dict[tuple[str, str, int], int] = {}
        late: dict[tuple[str, str, int], int] = {}
        visited = 0
        for run in list(o.pipelines.values()):
            if visited >= SLICE_TASKS:
                yield
                visited = 0
                if o.events_behind():  # fell behind meanwhile: the rest waits for the next
                    self.skipped += 1
                    # what this part counted stands (a task found starved now is not found
                    # starved again at the next look); the rest keeps its counts
                    self._stalled_looks = {
                        k: n for k, n in self._stalled_looks.items() if k[0] not in live
                    } | looks
                    self._overdue_looks = {
                        k: n for k, n in self._overdue_looks.items() if k[0] not in live
                    } | late
                    return
            if run.terminal or not o.failover.may_act(run.pipeline_id):
                continue
            visited += len(run.tasks)
            now = o.mono()
            live.add(run.pipeline_id)
            stalled = run.stalled(now, self.stall_s)
            if self._report(
                run,
                stalled,
                "stalled",
                "free to start on {} for over "
                f"{self.stall_s:.0f} s and not started; asking again",
            ):
                run.note(f"stalled, commit sent again: {', '.join(stalled)}")
            if stalled:
                o.spawn(o.commits.commit_all(run, set(stalled), look=False))
                starved = self._starved(run, stalled, looks)
                if starved:
                    log.warning(
                        "pipeline %s: %s still not started after being asked again; re-placing "
                        "them and re-running producers whose outputs are gone",
                        run.pipeline_id, ", ".join(sorted(starved)),
                    )  # fmt: skip
                    o.spawn(o.recovery.rerun_starved(run, starved))
            overdue = run.overdue(now, self.stall_s, OVERDUE_FACTOR)
            self._report(
                run,
                overdue,
                "overdue",
                "started on {} but not reported finished, "
                "far past its prediction; reading its events again",
            )
            ask = self._due_to_ask(run, overdue, late)
            if ask:
                o.spawn(self._ask_agents(run, ask, "overdue"))
            last = self._replayed.get(run.pipeline_id, -math.inf)
            if (
                (stalled or overdue)
                and now - last >= self.stall_s
                and run.pipeline_id not in self.replaying
                and len(self.replaying) < MAX_REPLAYS
            ):
                self._replayed[run.pipeline_id] = now
                self.replaying.add(run.pipeline_id)
                o.spawn(self._replay(run, {t: run.tasks[t].token for t in stalled}))
        self._stalled_looks = looks  # a task that started (or moved) is forgotten
        self._overdue_looks = late  # one that ended (or moved) too
        self._reported = {r for r in self._reported if r[0] in live}
        self._asked = {r for r in self._asked if r[0] in live}
        self._replayed = {p: t for p, t in self._replayed.items() if p in live}

    def _starved(
        self, run: PipelineRun, stalled: list[str], looks: dict[tuple[str, str, int], int]
    ) -> set[str]:
        """Count this look for each stalled task (under its current token); those stalled for
        STARVED_AFTER_LOOKS looks since the one that asked again, once each."""
        out = set()
        for t in stalled:
            key = (run.pipeline_id, t, run.tasks[t].token)
            n = looks[key] = self._stalled_looks.get(key, 0) + 1
            if n == 1 + STARVED_AFTER_LOOKS:
                out.add(t)
        return out

    def _due_to_ask(
        self, run: PipelineRun, overdue: list[str], late: dict[tuple[str, str, int], int]
    ) -> list[str]:
        """Count this look for each overdue task (under its current token); those whose agent
        is due to be asked about them: every STARVED_AFTER_LOOKS looks, from that many looks
        after the first that found them overdue (whose replay of the events found no end)."""
        due = []
        for t in overdue:
            key = (run.pipeline_id, t, run.tasks[t].token)
            n = late[key] = self._overdue_looks.get(key, 0) + 1
            if n > STARVED_AFTER_LOOKS and (n - 1) % STARVED_AFTER_LOOKS == 0:
                due.append(t)
        return self._reserve_asks(due)

    def _reserve_asks(self, tids: list[str]) -> list[str]:
        """As many of `tids` as MAX_ASKS leaves room for, counted as under way now (given back
        once answered, `_ask_agents`); the rest wait for a later look."""
        out = tids[: max(0, MAX_ASKS - self.asking)]
        self.asking += len(out)
        return out

    async def ask_about(self, run: PipelineRun, tids: list[str], kind: AskKind) -> None:
        """Ask the agents of these tasks (each once per placement, `_ask_agents` says which
        kinds count) whether they hold their jobs, as many as MAX_ASKS leaves room for; the
        rest are left to the looks."""
        ask = self._reserve_asks([
            t for t in tids if (run.pipeline_id, t, run.tasks[t].token) not in self._asked
        ])  # fmt: skip
        if ask:
            await self._ask_agents(run, ask, kind)

    async def _ask_agents(self, run: PipelineRun, tids: list[str], kind: AskKind) -> None:
        if kind not in ASKED_AGAIN:
            self._asked.update((run.pipeline_id, t, run.tasks[t].token) for t in tids)
        try:
            await asyncio.gather(*(self._ask(run, t, kind) for t in tids))
        finally:
            self.asking -= len(tids)

    async def _ask(self, run: PipelineRun, tid: str, kind: AskKind) -> None:
        """Ask the agent of a task whether it holds the job (`JobQuery`): an `overdue` started
        task whose end was never heard, a `stalled` one, committed and free to start but not
        started, one `waiting` for inputs on the agent of a stalled one it had lost, one of a
        pipeline just `adopted`, one `unbooked` (displaced.py), or one `unstarted` at the look
        after its commit (`Commits.confirm_loop`). What it does about its answer is the
        agent's (module docstring)."""
        o = self.o
        tr = run.tasks[tid]
        agent, device, token = tr.agent_id, tr.device_id, tr.token
        states = ASKED_STATES.get(kind, ("accepted",))  # every other kind: not started
        if o.nc is None or tr.state not in states or agent is None or device is None or token < 1:
            return  # (it ended, started, or was placed again since the look that found it)
        q = JobQuery(pipeline_id=run.pipeline_id, task_id=tid, device_id=device, token=token)
        try:
            rep = await o.ask_agent(subjects.job, agent, q, JobReply, timeout=JOB_QUERY_TIMEOUT_S)
        except nats.errors.NoRespondersError:
            self.job_answers["no_responders"] += 1
            if agent not in self._unasked:  # said once per agent
                self._unasked.add(agent)
                log.warning(
                    "agent %s does not answer job queries (no responder: a release before "
                    "them, or not connected now): %s/%s, %s, is left to it; asked again",
                    agent, run.pipeline_id, tid, kind,
                )  # fmt: skip
            return
        except (TimeoutError, nats.errors.Error, RemoteError, DecodeError) as exc:
            self.job_answers["no_answer"] += 1
            log.info("asking %s about %s/%s: %s", agent, run.pipeline_id, tid, exc)
            return
        self.job_answers[rep.state] += 1
        if rep.state == "held":  # asked again every few looks while it runs: said once
            seen = (run.pipeline_id, tid, token, "held")
            if seen in self._reported or kind in HELD_EXPECTED:
                return
            self._reported.add(seen)
        said = {
            "held": "holds it: left to run",
            "ended": "ran it: its end event is sent again",
            "gone": "holds no such job: it reports it cancelled, to be placed again",
        }[rep.state]
        run.note(f"{tid} {kind}, asked {agent} about token {token}: {said}")
        log.warning("pipeline %s: task %s %s; %s %s", run.pipeline_id, tid, kind, agent, said)
        if (
            rep.state == "ended"
            and run.tasks[tid].token == token
            and run.tasks[tid].state not in TASK_ENDED_STATES
            and run.pipeline_id not in self.replaying
        ):
            # its end is in the stream if its agent's journal saw it delivered (sent again
            # only if not): read the pipeline's events again now, not a stall time later
            self.replaying.add(run.pipeline_id)
            self._replayed[run.pipeline_id] = self.o.mono()
            self.o.spawn(self._replay(run, {}))
        if rep.state == "gone" and kind == "stalled":  # (`unstarted` asks about them all)
            # an agent that lost one job of the pipeline (a process restarted unseen) has
            # likely lost the others queued there, waiting for inputs: asked now, not each
            # when it is found stalled in turn (a look and a stall time apart)
            await self.ask_about(run, sorted(
                t for t, other in run.tasks.items()
                if t != tid and other.state == "accepted" and other.agent_id == agent
            ), "waiting")  # fmt: skip

    def _report(self, run: PipelineRun, tids: list[str], kind: str, what: str) -> bool:
        """Log each task of `tids` not reported yet as `kind`; True if any was new."""
        fresh = False
        for t in tids:
            tr = run.tasks[t]
            key = (run.pipeline_id, t, tr.token, kind)
            if key in self._reported:
                continue
            self._reported.add(key)
            fresh = True
            where = f"{tr.agent_id}:{tr.device_id} (token {tr.token})"
            log.warning("pipeline %s: task %s %s", run.pipeline_id, t, what.format(where))
        return fresh

    async def _replay(self, run: PipelineRun, stalled: dict[str, int]) -> None:
        """Read the pipeline's events again; then ask the agents of the `stalled` tasks (task
        -> token) the stream had no start or end of either whether they hold the job (asked
        before the stream was read, the agent of a short task that had run, whose end only
        the stream held, said `gone`, and the task ran again)."""
        try:
            await self.o.failover.replay(run)
        except Exception as exc:
            log.warning("replaying events of %s failed: %s", run.pipeline_id, exc)
            return
        finally:
            self.replaying.discard(run.pipeline_id)
        if run.terminal:
            return
        await self.ask_about(run, [
            t for t, token in sorted(stalled.items())
            if run.tasks[t].state == "accepted" and run.tasks[t].token == token
        ], "stalled")  # fmt: skip
