"""Commits: telling agents to start the tasks they accepted, and making sure they heard.

A new plan's commits go out as plain messages (two messages fewer per agent of every plan);
the tasks' events say they arrived. Each is looked at COMMIT_CONFIRM_S later: an agent with a
task of it free to start for that long and not reported started is asked again by request, and
asked whether it holds the job at all. Commits are idempotent on the agent, so asking again is
always safe. The service shell (orchestrator/service.py) owns the connection and the
pipelines."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections import Counter
from typing import TYPE_CHECKING

from schemas import subjects
from schemas.codec import Encoding
from schemas.placement import CommitCommand

if TYPE_CHECKING:
    from orchestrator.ports import CommitsDoor
    from orchestrator.state.pipelines import PipelineRun

log = logging.getLogger("mars.orchestrator")

#: Offers and commits go to agents as JSON (their replies come back in it): pydantic parses
#: and validates JSON in one pass, a 4-offer batch in ~100 us on both sides together against
#: ~190 us as msgpack (agents read either, by Content-Type).
AGENT_ENCODING: Encoding = "json"
#: How long an offer's or a commit's answer is awaited.
OFFER_TIMEOUT_S = 2.0
#: First back-off before telling an agent again to start accepted tasks, growing by as much
#: each time up to COMMIT_BACKOFF_MAX_S; cut short when the agent is heard from (`heard_from`).
COMMIT_BACKOFF_S = 0.2
COMMIT_BACKOFF_MAX_S = 2.0
#: A new plan's commits go out as plain messages, unanswered; this long after (and again while
#: its tasks wait for inputs), an agent with a task of it free to start for this long and not
#: reported started is told again by request.
COMMIT_CONFIRM_S = 1.0


class Commits:
    """One replica's commits and their looks (`confirm_loop` runs while it serves)."""

    def __init__(self, o: CommitsDoor) -> None:
        self.o = o
        #: New plans' commits asked again by request (no sign of them after COMMIT_CONFIRM_S).
        self.resent = 0
        #: Unanswered commits to look at, a heap: (when, n, pipeline, agent, task ids, the
        #: wait before the next look).
        self._queue: list[tuple[float, int, str, str, tuple[str, ...], float]] = []
        self._n = itertools.count()
        #: (pipeline, task) -> looks queued for it that found it waiting for inputs (their
        #: next look a doubled wait away): its producer's end makes it due a look sooner.
        self.awaited: Counter[tuple[str, str]] = Counter()
        self._wake = asyncio.Event()
        #: agent -> set when it is heard from next, for the commits backing off from it (how
        #: many: the entry goes with the last of them).
        self._back: dict[str, asyncio.Event] = {}
        self._backing: Counter[str] = Counter()

    def heard_from(self, agent_id: str) -> None:
        """An agent's advert came: it sends one as it connects and again after each
        reconnect, once its subscriptions are back, so commits to it backing off after a
        failure go now. After a server restart an agent comes back up to its reconnect
        back-off later (`reconnect_max_s`): a commit asked only on its own schedule would
        reach it up to one interval after that."""
        back = self._back.pop(agent_id, None)
        if back is not None:
            back.set()

    async def _back_off(self, agent_id: str, wait_s: float) -> None:
        """`wait_s`, or until the agent is heard from, if that is sooner."""
        back = self._back.setdefault(agent_id, asyncio.Event())
        self._backing[agent_id] += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await back.wait()
        finally:
            self._backing[agent_id] -= 1
            if self._backing[agent_id] <= 0:  # nobody waits on it now
                del self._backing[agent_id]
                self._back.pop(agent_id, None)

    async def commit_all(
        self,
        run: PipelineRun,
        task_ids: set[str],
        *,
        unanswered: bool = False,
        look: bool = True,
    ) -> None:
        """Tell each agent to start its accepted tasks of `run`; an agent that does not answer
        is asked again (commits are idempotent) while the pipeline lives.

        `unanswered` (a new plan's commits): each agent is told by a plain message, which it
        does not answer, two messages fewer per agent of every plan. The tasks' events say it
        arrived: `confirm_loop` asks by request, as above, an agent with a task of it free to
        start for COMMIT_CONFIRM_S and not reported started. An answered commit is looked at
        the same way (`look`; not a commit sent again by a look or the watchdog): an answer
        says the message came, not that the task will start (a re-placed consumer whose input
        never came would wait for the stall watchdog)."""
        o = self.o
        per_agent: dict[str, list[str]] = {}
        for tid in sorted(task_ids):
            agent = run.tasks[tid].agent_id
            if agent:
                per_agent.setdefault(agent, []).append(tid)

        async def one(agent_id: str, tids: list[str]) -> None:
            # each task's token: a first placement was offered before its booking was written
            cmd = CommitCommand(
                pipeline_id=run.pipeline_id, task_ids=tids,
                tokens=[run.tasks[t].token for t in tids],
            )  # fmt: skip
            if unanswered and await self._unanswered(run, agent_id, cmd):
                return
            attempt = 0
            while True:
                attempt += 1
                try:
                    await o.ask_agent(
                        subjects.commit, agent_id, cmd.model_copy(update={"sent_at": o.wall()}),
                        CommitCommand,
                        timeout=OFFER_TIMEOUT_S, encoding=AGENT_ENCODING,
                    )  # fmt: skip
                    if look:
                        self.look_later(run.pipeline_id, agent_id, tuple(tids), COMMIT_CONFIRM_S)
                    return
                except Exception as exc:
                    log.warning("commit to %s failed (attempt %d): %s", agent_id, attempt, exc)
                # ask again while the tasks still wait there; an agent that died is recovery's
                if run.terminal or not any(
                    run.tasks[t].agent_id == agent_id and run.tasks[t].state == "accepted"
                    for t in tids
                ):
                    return
                # back off, ask again: sooner if it is heard from (back after a reconnect)
                await self._back_off(
                    agent_id, min(COMMIT_BACKOFF_S * attempt, COMMIT_BACKOFF_MAX_S)
                )

        await asyncio.gather(*(one(a, t) for a, t in per_agent.items()))

    async def _unanswered(self, run: PipelineRun, agent_id: str, cmd: CommitCommand) -> bool:
        """Send `cmd` to the agent as a plain message, to be looked after COMMIT_CONFIRM_S
        later (`confirm_loop`); False when it could not be sent (ask by request)."""
        try:
            sent = cmd.model_copy(update={"sent_at": self.o.wall()})  # the booking clock now
            await self.o.tell_agent(subjects.commit, agent_id, sent, encoding=AGENT_ENCODING)
        except Exception as exc:
            log.warning("commit to %s not sent (asking by request): %s", agent_id, exc)
            return False
        self.look_later(run.pipeline_id, agent_id, tuple(cmd.task_ids), COMMIT_CONFIRM_S)
        return True

    def look_later(self, pid: str, agent_id: str, tids: tuple[str, ...], wait_s: float) -> None:
        due = self.o.mono() + wait_s
        if wait_s > COMMIT_CONFIRM_S:  # a look again at tasks found waiting for inputs
            self.awaited.update((pid, t) for t in tids)
        queue = self._queue
        if not queue or due < queue[0][0]:
            self._wake.set()  # the loop waits for an earlier look now
        heapq.heappush(queue, (due, next(self._n), pid, agent_id, tids, wait_s))

    def look_sooner(self, run: PipelineRun, producer: str) -> None:
        """Consumers of an ended producer whose commits are looked at with doubling waits
        (found waiting for inputs): looked at COMMIT_CONFIRM_S from now, when they may be
        free to start, not up to half the stall time later (a commit lost while its agent
        was away, reconnecting after a server restart, would be sent again that late)."""
        pid = run.pipeline_id
        for c in run.children[producer]:
            tr = run.tasks[c]
            if (pid, c) in self.awaited and tr.state == "accepted" and tr.agent_id:
                self.look_later(pid, tr.agent_id, (c,), COMMIT_CONFIRM_S)

    async def confirm_loop(self) -> None:
        """Look at each unanswered commit when it is due: an agent with a task of it free to
        start for COMMIT_CONFIRM_S and not reported started is asked by request. While some
        of its tasks wait for inputs it is looked at again, each wait twice the one before
        (up to half the watchdog's stall time). Entries are kept by id: a pipeline ended
        meanwhile is not held in memory for them."""
        o, queue = self.o, self._queue
        longest = max(COMMIT_CONFIRM_S, o.watchdog.stall_s / 2)
        while True:
            wait = queue[0][0] - self.o.mono() if queue else None
            if wait is None or wait > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):  # the first look's time, or an earlier one
                        await self._wake.wait()
                continue
            _, _, pid, agent_id, tids, wait_s = heapq.heappop(queue)
            if wait_s > COMMIT_CONFIRM_S:
                self.awaited.subtract((pid, t) for t in tids)
                for t in tids:
                    if self.awaited[(pid, t)] <= 0:
                        self.awaited.pop((pid, t), None)
            run = o.pipelines.get(pid)
            if run is None or run.terminal:
                continue
            if not o.failover.may_act(pid):
                if o.failover.holds(pid):
                    # its lease lapsed here and is still ours (the server away, or JetStream
                    # slow just after it came back): looked at again, acted on once renewed.
                    # Dropped, a lost commit would wait for the watchdog's stall time
                    self.look_later(pid, agent_id, tids, wait_s)
                continue  # (no longer ours to act on: the adopter commits again)
            if o.events_behind():  # what it knows of the tasks is old: look again later
                self.look_later(pid, agent_id, tids, wait_s)
                continue
            waiting = {
                t for t in tids
                if run.tasks[t].agent_id == agent_id and run.tasks[t].state == "accepted"
            }  # fmt: skip
            if run.stalled(self.o.mono(), COMMIT_CONFIRM_S, only=waiting):
                self.resent += 1
                log.info(
                    "pipeline %s: task(s) on %s free to start for %.1f s and not reported "
                    "started; sending their commit again by request", pid, agent_id,
                    COMMIT_CONFIRM_S,
                )  # fmt: skip
                o.spawn(self.commit_all(run, waiting, look=False))
                # and whether it holds them at all: a commit for a job it no longer holds (an
                # offer it gave up uncommitted while the server was away, a process restarted
                # unseen) starts nothing, and is answered all the same; one it lost is placed
                # again now, not when the stall watchdog finds it
                o.spawn(o.watchdog.ask_about(run, sorted(waiting), "unstarted"))
            elif waiting:  # not free to start yet: no sign is missing so far
                self.look_later(pid, agent_id, tuple(sorted(waiting)), min(2 * wait_s, longest))
