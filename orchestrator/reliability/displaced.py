"""Tasks put back after losing what their plan counted on: their reserved window (evicted by
a higher-priority pipeline, with a notice or without one heard: the window audit) or an input
(a producer's output handed to a place a move withdrew: `InputGone`). The owner re-places
what can move, re-runs producers whose outputs are gone, and tells running producers where
moved consumers went. Thin shells over the placement loop and recovery, for one replica."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, TypeVar

from nats.aio.msg import Msg

from orchestrator.placement.placer import PlacementFailed, descendants
from orchestrator.reservations.store import device_key_of
from orchestrator.scheduling import Placement
from schemas import subjects
from schemas.bookings import BookingWindow
from schemas.codec import DecodeError, decode, encode
from schemas.placement import DataTransfer, EvictNotice, FetchRequest, InputGone
from schemas.wire import SENDER_SUBJECTS

if TYPE_CHECKING:
    from orchestrator.ports import DisplacedDoor
    from orchestrator.state.pipelines import PipelineRun

log = logging.getLogger("mars.orchestrator")


#: Reports of gone inputs, and lost windows, remembered as acted on, at most.
MAX_REGROWN = 4096
#: Placements the window audit reads between turns it gives the event loop.
SLICE_TASKS = 2000
#: How long an eviction notice waits to read its key (under the pipeline's recovery lock)
#: before it is trusted as it is.
READ_S = 0.5
#: Notices parked while leases lapsed (`park`), at most, over all pipelines.
MAX_PARKED = 4096


N = TypeVar("N", EvictNotice, InputGone)


def _notice(msg: Msg, model: type[N], subject: Callable[[str], str]) -> N | None:
    """A notice (nothing to answer) decoded through the codec, or None, logged: bytes that are
    not one, or one published under another pipeline's subject."""
    try:
        note = decode(msg.data, model)
    except DecodeError as exc:
        log.debug("dropped a bad %s on %s: %s", model.__name__, msg.subject, exc.message)
        return None
    if msg.subject != subject(note.pipeline_id):
        log.debug("dropped %s for %s sent on %s", model.__name__, note.pipeline_id, msg.subject)
        return None
    return note


class Displaced:
    """One replica's handling of displaced tasks (`Orchestrator.displaced`): acts only on
    pipelines whose ownership lease it holds, each under the pipeline's recovery lock."""

    def __init__(self, orch: DisplacedDoor) -> None:
        self.o = orch
        self.evictions_seen = 0
        #: `InputGone` notices dropped because their subject names another agent than the
        #: consumer's (one agent speaking for another).
        self.misnamed_notices = 0
        #: Producers run again because an agent reported their output gone, and the reports
        #: already acted on: (pipeline, consumer, its token, producer, its token).
        self.inputs_regrown = 0
        self._regrown: set[tuple[str, str, int, str, int]] = set()
        #: Reports about a producer whose end had not been heard yet, per (pipeline, producer),
        #: with the producer's token then.
        self.early: dict[tuple[str, str], tuple[InputGone, int]] = {}
        #: Tasks found unbooked (`audit_windows`): (pipeline, task, token) missing at the last
        #: audit, those acted on (or known started: `started_unheard`), and how many were
        #: placed again.
        self._unbooked: set[tuple[str, str, int]] = set()
        self._unbooked_done: set[tuple[str, str, int]] = set()
        self.windows_lost = 0
        #: Started tasks' windows made non-preemptible (`hold_started`).
        self.windows_held = 0
        #: Notices that came while the pipeline's lease had lapsed here, still this
        #: replica's, per pipeline, in arrival order (`park`, `resume`); how many in all.
        self._parked: dict[str, list[EvictNotice | InputGone]] = {}
        self.parked = 0

    async def producer_ended(self, run: PipelineRun, task_id: str) -> None:
        """A report that waited for this producer's end (`early`) is acted on now."""
        if self.early:
            early = self.early.pop((run.pipeline_id, task_id), None)
            if early is not None and early[1] == run.tasks[task_id].token:
                await self.input_gone(early[0])  # the placement it was about ended

    def started_unheard(self, pipeline_id: str, task_id: str, token: int) -> None:
        """Its agent says this placement of the task has started (`already_ran`,
        `already_running`), though its start is not heard yet: its window may be gone (it
        was evicted), but it waits for nothing, and the audit leaves it be."""
        self._unbooked_done.add((pipeline_id, task_id, token))

    async def hold_started(self, run: PipelineRun, task_id: str, token: int) -> None:
        """A started task of a preemptible pipeline keeps its window: an eviction never stops
        a running task (its owner leaves it where it runs), so a higher-priority plan that
        took the window would only queue behind it, its start and end wrong by what the task
        has left to run, instead of planning around it. `token`: the placement that started.

        Not beside a re-placement of the pipeline: one under way books the task's next
        window before it knows whether the task stays (its agent may say it started), and the
        window to hold is the started placement's, which the records name only after it."""
        if not run.spec.preemptible:
            return
        async with self.o.recovery.lock(run.pipeline_id):
            tr, booked = run.tasks.get(task_id), run.windows.get(task_id)
            if tr is None or tr.token != token or tr.state != "started" or booked is None:
                return  # placed again since, or ended: its window is not the started one's
            key, start, end = booked
            try:
                if await self.o.store.hold(key, run.pipeline_id, task_id, start, end):
                    self.windows_held += 1
                    run.note(f"{task_id} started: its window on {key} is no longer preemptible")
            except Exception as exc:  # the key is written by others too: they may take it still
                log.warning("holding %s/%s on %s: %r", run.pipeline_id, task_id, key, exc)

    def forget(self, pipeline_id: str) -> None:
        if self.early:
            for k in [k for k in self.early if k[0] == pipeline_id]:
                del self.early[k]

    def _unbooked_now(
        self, run: PipelineRun, tid: str, now: float, memo: dict[str, set[tuple[str, str]]]
    ) -> bool:
        """Whether `tid`, waiting to start, has no live window where its records say it is
        booked, by the cache, which has seen that booking (its token is the revision that
        wrote it). `memo`: each key's live windows, made once per look. An adopted pipeline
        has no record of its windows: its placements say where they are."""
        tr, p = run.tasks.get(tid), run.placements.get(tid)
        if tr is None or p is None or tr.state not in ("offered", "accepted"):
            return False
        key = device_key_of(p.device_id)
        if run.windows.get(tid, (key,))[0] != key or f"{tr.agent_id}:{tr.device_id}" != p.device_id:
            return False  # records in the middle of a move
        cur = self.o.store.cache.get(key)
        if cur is None or cur.revision < tr.token:
            return False  # a departed device's key (recovery's business), or not seen yet
        have = memo.get(key)
        if have is None:
            have = memo[key] = {
                (w.pipeline_id, w.task_id) for w in cur.book.windows if w.expires > now
            }
        return (run.pipeline_id, tid) not in have

    async def audit_windows(self) -> int:
        """Place again tasks waiting to start whose window is gone from their key: evicted
        with a notice this replica never heard (sent while another replica owned the
        pipeline, or during a reconnect), or expired while this process could not renew.
        Such a task holds no reservation and others may book its time. Taken as gone only
        when missing at two audits in a row under the same token (a placement under way
        changes windows and tokens between its steps); acted on once per token. Returns how
        many tasks it found gone."""
        now = self.o.wall()
        memo: dict[str, set[tuple[str, str]]] = {}
        missing: set[tuple[str, str, int]] = set()
        gone: dict[str, list[str]] = {}
        read = 0
        for run in list(self.o.pipelines.values()):
            if read >= SLICE_TASKS:
                await asyncio.sleep(0)
                read, memo = 0, {}
            pid = run.pipeline_id
            if run.terminal or run.committed_at is None or not self.o.failover.may_act(pid):
                continue
            read += len(run.placements)
            for tid in run.placements:
                if not self._unbooked_now(run, tid, now, memo):
                    continue
                mark = (pid, tid, run.tasks[tid].token)
                missing.add(mark)
                if mark in self._unbooked and mark not in self._unbooked_done:
                    gone.setdefault(pid, []).append(tid)
        self._unbooked = missing
        if len(self._unbooked_done) >= MAX_REGROWN:
            self._unbooked_done &= missing  # only marks still missing can come round again
        for pid, tids in gone.items():
            self.o.spawn(self._rebook(self.o.pipelines[pid], tids))
        return sum(len(t) for t in gone.values())

    async def _rebook(self, run: PipelineRun, tids: list[str]) -> None:
        async with self.o.recovery.lock(run.pipeline_id):
            if run.terminal or not self.o.failover.may_act(run.pipeline_id):
                return
            memo: dict[str, set[tuple[str, str]]] = {}
            now = self.o.wall()
            still = [t for t in tids if self._unbooked_now(run, t, now, memo)]
            if not still:
                return
            self._unbooked_done.update((run.pipeline_id, t, run.tasks[t].token) for t in still)
            self.windows_lost += len(still)
            where = ", ".join(f"{t} on {run.placements[t].device_id}" for t in sorted(still))
            run.note(f"windows gone (an eviction not heard, or a lapsed lease): {where}")
            queued = await self._move_unbooked(
                run, still, "a lost window", "its reservation was lost"
            )
        # A window gone unheard is a sign the pipeline's agents may have gone through what
        # took it (a lease lapsed in an outage, and a fleet restarted in it): a task left
        # queued where it was, its inputs already on their way, is asked about at once. An
        # agent that lost the job says so and the task is placed again now, not when the
        # stall watchdog finds it
        waiting = sorted(t for t in queued if run.tasks[t].state == "accepted")
        if waiting:
            self.o.spawn(self.o.watchdog.ask_about(run, waiting, "unbooked"))

    async def notify_evicted(self, key: str, windows: list[BookingWindow], by: str) -> None:
        assert self.o.nc is not None
        per_pipe: dict[str, list[str]] = {}
        for w in windows:
            per_pipe.setdefault(w.pipeline_id, []).append(w.task_id)
        for pid, tids in per_pipe.items():
            note = EvictNotice(
                pipeline_id=pid,
                task_ids=sorted(tids),
                device=key,
                by_pipeline=by,
                reason=f"preempted by higher-priority {by}",
            )
            await self.o.nc.publish(subjects.eviction(pid), encode(note))

    def park(self, note: EvictNotice | InputGone) -> bool:
        """Keep a notice for a pipeline whose lease has lapsed here and is still this
        replica's (the server away, or JetStream slow just after it came back) until the lease
        is renewed (`resume`); returns whether it was kept. (Dropped instead, a taken window
        waited for two window audits after the renewal, a gone input for the stall
        watchdog.) The pipeline's end or loss drops what is kept (`drop_parked`)."""
        pid = note.pipeline_id
        if not self.o.failover.holds(pid) or self.o.failover.may_act(pid):
            return False
        if self.parked >= MAX_PARKED:  # those of pipelines lost or ended meanwhile go first
            for other in [p for p in self._parked if not self.o.failover.holds(p)]:
                self.parked -= len(self._parked.pop(other))
            if self.parked >= MAX_PARKED:
                return False
        self._parked.setdefault(pid, []).append(note)
        self.parked += 1
        return True

    def drop_parked(self, pid: str) -> None:
        self.parked -= len(self._parked.pop(pid, ()))

    async def resume(self, pid: str) -> None:
        """Act on what was parked for `pid`, its lease renewed; each handler checks again
        whether the notice still holds (the key is read, tokens compared)."""
        notes = self._parked.pop(pid, [])
        self.parked -= len(notes)
        for note in notes:
            if isinstance(note, EvictNotice):
                await self.evicted(note)
            else:
                await self.input_gone(note)

    async def on_evict(self, msg: Msg) -> None:
        note = _notice(msg, EvictNotice, subjects.eviction)
        if note is None:
            return
        self.o.adaptive.evicted(note)
        await self.evicted(note)

    async def evicted(self, note: EvictNotice) -> None:
        pid = note.pipeline_id
        run = self.o.pipelines.get(pid)
        if run is None or run.terminal or self.park(note) or not self.o.failover.may_act(pid):
            return
        self.evictions_seen += 1
        async with self.o.recovery.lock(run.pipeline_id):  # not beside a re-run of its producers
            # noted in the order it is handled: a re-placement holding the lock may have
            # booked the very window taken (a dead agent's task placed again), and its note
            # must come first (noted on arrival, the log would read as a firm window taken)
            run.note(f"evicted from {note.device}: {', '.join(note.task_ids)} ({note.reason})")
            if run.terminal:
                return
            # a window left on a key by an earlier placement of a task (one that moved since
            # and whose old window was not given back) draws a notice too: the task was not
            # displaced, and moving it would only throw its queue place away
            here = [t for t in note.task_ids if self._placed_on(run, t, note.device)]
            if len(here) < len(note.task_ids):
                gone = sorted(set(note.task_ids) - set(here))
                run.note(f"evicted windows of {', '.join(gone)} were stale: not placed there now")
            if here:
                # the key says what was taken: a notice heard twice, or one that is not true,
                # finds the window still there (a KV read it cannot fool; trusted if that fails)
                try:
                    cur = await asyncio.wait_for(self.o.store.refresh(note.device), READ_S)
                except Exception as exc:
                    log.warning("reading %s for an eviction of %s: %r", note.device, pid, exc)
                else:
                    live = set() if cur is None else {
                        w.task_id for w in cur.book.windows
                        if w.pipeline_id == pid and w.expires > self.o.wall()
                    }  # fmt: skip
                    kept = sorted(t for t in here if t in live)
                    if kept:
                        run.note(f"{', '.join(kept)} still booked on {note.device}: not moved")
                        here = [t for t in here if t not in live]
            if here:
                for t in here:  # its next window ranks higher for each one taken
                    run.evictions[t] = min(1000, run.evictions.get(t, 0) + 1)
                await self._move_unbooked(run, here, "eviction", f"preempted by {note.by_pipeline}")

    @staticmethod
    def _placed_on(run: PipelineRun, task_id: str, key: str) -> bool:
        p = run.placements.get(task_id)
        return p is not None and device_key_of(p.device_id) == key

    async def _move_unbooked(
        self, run: PipelineRun, task_ids: Collection[str], after: str, why: str
    ) -> set[str]:
        """Place again tasks whose windows were taken (`after` an eviction) or found gone (a
        lost notice, a lapsed lease: `audit_windows`); `why` goes to agents that lose one.
        Returns the tasks that stay queued where they are (their inputs on their way)."""
        # only tasks with no data in flight can move: not started, and no producer started
        movable = {
            t for t in task_ids
            if run.tasks[t].state in ("offered", "accepted")
            and all(run.tasks[d].state in ("offered", "accepted")
                    for d in run.spec_by_id[t].deps)
        }  # fmt: skip
        queued = set(task_ids) - movable
        if not movable:
            run.note(f"{', '.join(sorted(task_ids))} already have data in flight; they stay queued")
            return queued
        # What waits for them is booked again after them, where it is: left as it was, a
        # consumer's window would come before its input (it would run late, outside it), and
        # a moved task that stays on its device cannot be booked over its own consumer's
        # window there (a pipeline's own window is no eviction's to take): round after round
        # of conflicts with itself
        later = {
            d for d in descendants(run, movable) - movable
            if run.tasks[d].state in ("offered", "accepted")
        }  # fmt: skip
        old = {t: run.placements[t] for t in movable | later}
        keep = self.o.view.only_on({t: old[t].device_id for t in later})
        # A task with inputs stays on its device, booked after what took its place: a
        # producer whose end has not been heard here yet may have sent its output there, and
        # a move would lose it (found by the new agent's fetch: the producer runs again).
        # Anywhere, if its device has no room left for it; and as before (the moved tasks
        # alone, anywhere) if what waits for them has no room where it is.
        stay = self.o.view.only_on({t: old[t].device_id for t in movable if run.spec_by_id[t].deps})
        tries = [(movable | later, stay | keep)]
        if stay:
            tries.append((movable | later, keep))
        if later:
            tries.append((movable, set()))
        failed: PlacementFailed | None = None
        for only, exclude in tries:
            try:
                await self.o.placer.place(run, only=only, exclude=exclude)
            except PlacementFailed as exc:
                failed = exc
                continue
            break
        else:
            run.note(f"re-placing {', '.join(sorted(movable))} after {after} failed: {failed}")
            return queued
        moved = {
            t: p for t, p in old.items() if t in only and run.placements[t].device_id != p.device_id
        }  # fmt: skip
        await self.o.cancel_tasks(run, moved, why)
        await self.o.commits.commit_all(run, only)
        # a producer may have started while they were re-placed (their offers told it where
        # they were); one that ended meanwhile is found out by their agents' fetch (input gone)
        await self.reroute_producers(run, moved)
        again = sorted(only - movable)
        run.note(
            f"re-placed after {after}: {', '.join(sorted(movable))}"
            + (f"; {', '.join(again)} booked again after" if again else "")
        )
        await self.o.persist(run)
        await self.o.notify_changed()
        return queued

    async def on_input_gone(self, msg: Msg) -> None:
        """An agent found a finished producer's output gone where this replica's records say
        it is (a move raced the producer's end, or its agent restarted): run the producer
        again now, the consumer staying where it waits, not two stall-watchdog looks later.
        Only a report about the consumer's current placement and a producer that succeeded
        where it says is acted on (one whose end is not heard yet waits for it), once per
        pair of placements; anything else is stale or not this replica's."""
        try:
            note = decode(msg.data, InputGone)
        except DecodeError as exc:
            log.debug("dropped a bad InputGone on %s: %s", msg.subject, exc.message)
            return
        named = subjects.input_gone_parts(msg.subject)
        if named is None or named[0] != note.pipeline_id:
            log.debug("dropped InputGone for %s sent on %s", note.pipeline_id, msg.subject)
            return
        sender = named[1]
        # only the consumer's own agent may report its input gone: the subject names its
        # publisher (the server's permissions see to that); an agent of wire level 4 or
        # older names none, and one of a later level always does
        if sender != note.agent_id and (
            sender is not None or self.wire_of(note.agent_id) >= SENDER_SUBJECTS
        ):
            self.misnamed_notices += 1
            log.info(
                "dropped InputGone of %s/%s: it names agent %s, its subject %s",
                note.pipeline_id, note.consumer, note.agent_id, msg.subject,
            )  # fmt: skip
            return
        await self.input_gone(note)

    def wire_of(self, agent_id: str) -> int:
        entry = self.o.view.agents.get(agent_id)
        return entry.wire if entry is not None else 1

    async def input_gone(self, note: InputGone) -> None:
        pid = note.pipeline_id
        run = self.o.pipelines.get(pid)
        if run is None or run.terminal or self.park(note) or not self.o.failover.may_act(pid):
            return
        i = run.index.get(note.consumer)
        if i is None or note.producer not in run.spec.tasks[i].deps:
            return
        tr, prod = run.tasks[note.consumer], run.tasks[note.producer]
        if (
            tr.state not in ("offered", "accepted")
            or (tr.token, tr.agent_id) != (note.token, note.agent_id)
            or prod.agent_id != note.producer_agent
        ):
            return
        if prod.state != "succeeded":
            if prod.state in ("accepted", "started") and len(self.early) < MAX_REGROWN:
                # its agent holds neither its output nor its job: it ended there, and its end
                # has not been heard here yet; acted on when it is (`_task_event`)
                self.early[(run.pipeline_id, note.producer)] = (note, prod.token)
                await self.o.notify_changed()
            return
        key = (run.pipeline_id, note.consumer, note.token, note.producer, prod.token)
        if key in self._regrown:
            return
        if len(self._regrown) >= MAX_REGROWN:
            self._regrown.clear()  # a repeat only runs the producer once more
        self._regrown.add(key)
        self.inputs_regrown += 1
        why = (
            f"{note.agent_id}: input {note.producer} of {note.consumer} is gone from "
            f"{note.producer_agent}"
        )
        consumer, token = run.tasks[note.consumer], note.token

        def still() -> bool:  # not re-timed by another report's re-run meanwhile
            return consumer.token == token and consumer.state in ("offered", "accepted")

        self.o.spawn(self.o.recovery.rerun_lost(run, {note.producer}, why, still))

    async def reroute_producers(self, run: PipelineRun, moved: Mapping[str, Placement]) -> None:
        """A running producer was told where its consumers were when it was offered: ask its
        agent, for each moved consumer, to send the output to the new place when it is done.
        All at once: callers hold the pipeline's recovery lock, and one unresponsive agent's
        timeout should not be paid once per producer."""
        nc = self.o.nc
        assert nc is not None

        async def ask(agent: str, req: FetchRequest) -> None:
            # "not finished, sent when it is" is the expected answer; a finished producer
            # serves the new consumer's own fetch instead (or is found gone by it)
            with contextlib.suppress(Exception):
                await self.o.ask_agent(subjects.fetch, agent, req, DataTransfer, timeout=2.0)

        asks = []
        for tid in sorted(moved):
            tr = run.tasks[tid]
            for dep in run.spec_by_id[tid].deps:
                prod = run.tasks[dep]
                if prod.state != "started" or not prod.agent_id or not tr.agent_id:
                    continue
                req = FetchRequest(
                    pipeline_id=run.pipeline_id, producer=dep, consumer=tid,
                    agent_id=tr.agent_id, token=prod.token,
                )  # fmt: skip
                asks.append(ask(prod.agent_id, req))
        await asyncio.gather(*asks)
