"""The stall watchdog: no pipeline is held open for ever by one lost message.

Task events reach the orchestrator on a core NATS subscription, commits are single requests.
A task free to start (committed, every input made, its planned start come) that is not
reported started within `stall_s`, or a started task whose end is not reported within
`stall_s` plus OVERDUE_FACTOR times its prediction, is logged once; the first kind's agent is
asked to start it again (commits are idempotent; a repeated one also makes the agent fetch
any input still missing), and for either the pipeline's task events
are read again from MARS_EVENTS (repeats are ignored by event id; at most MAX_REPLAYS at once).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from orchestrator.pipelines import PipelineRun

if TYPE_CHECKING:
    from orchestrator.service import Orchestrator

log = logging.getLogger("mars.watchdog")

#: Seconds a task may be free to start without starting.
STALL_S = 10.0
#: A started task is overdue after STALL_S plus this many times its predicted duration.
OVERDUE_FACTOR = 3.0
#: Asked again this many watchdog looks ago and still not started: its inputs are re-made.
STARVED_AFTER_LOOKS = 2
#: Replays of pipelines' task events under way at once (each opens a JetStream consumer): an
#: overloaded orchestrator, whose every pipeline looks stalled, is not buried under its own
#: replays; the others are due at a later look.
MAX_REPLAYS = 8
#: A look gives the event loop a turn after about this many tasks looked at (~1 ms here): with
#: thousands of live pipelines one pass held the loop for tens of ms (1,000 of 20 tasks: ~20;
#: 5,000: ~95), and every submission and task event arriving meanwhile waited behind it.
SLICE_TASKS = 1000


class Watchdog:
    def __init__(self, orch: Orchestrator, stall_s: float = STALL_S) -> None:
        self.o = orch
        self.stall_s = stall_s
        #: (pipeline, task, token, kind) already reported
        self._reported: set[tuple[str, str, int, str]] = set()
        #: pipeline -> when its events were last read again
        self._replayed: dict[str, float] = {}
        #: (pipeline, task, token) stalled -> looks it has stayed stalled since first seen
        self._stalled_looks: dict[tuple[str, str, int], int] = {}
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
                    return
            if run.terminal or not o.failover.may_act(run.pipeline_id):
                continue
            visited += len(run.tasks)
            now = o._now()
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
                o._spawn(o._commit_all(run, set(stalled)))
                starved = self._starved(run, stalled, looks)
                if starved:
                    log.warning(
                        "pipeline %s: %s still not started after being asked again; re-placing "
                        "them and re-running producers whose outputs are gone",
                        run.pipeline_id, ", ".join(sorted(starved)),
                    )  # fmt: skip
                    o._spawn(o.recovery.rerun_starved(run, starved))
            overdue = run.overdue(now, self.stall_s, OVERDUE_FACTOR)
            self._report(
                run,
                overdue,
                "overdue",
                "started on {} but not reported finished, "
                "far past its prediction; reading its events again",
            )
            last = self._replayed.get(run.pipeline_id, -math.inf)
            if (
                (stalled or overdue)
                and now - last >= self.stall_s
                and run.pipeline_id not in self.replaying
                and len(self.replaying) < MAX_REPLAYS
            ):
                self._replayed[run.pipeline_id] = now
                self.replaying.add(run.pipeline_id)
                o._spawn(self._replay(run))
        self._stalled_looks = looks  # a task that started (or moved) is forgotten
        self._reported = {r for r in self._reported if r[0] in live}
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

    async def _replay(self, run: PipelineRun) -> None:
        try:
            await self.o.failover.replay(run)
        except Exception as exc:
            log.warning("replaying events of %s failed: %s", run.pipeline_id, exc)
        finally:
            self.replaying.discard(run.pipeline_id)
