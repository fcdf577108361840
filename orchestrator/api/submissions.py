"""The submit endpoint: its queue and workers, and each new pipeline's placement and answer.

Submissions wait in the replica's own queue with when they arrived (a client's deadline is
judged against it), SUBMITS_AT_ONCE are served at once, and each new pipeline is claimed,
planned, booked, offered and committed (`Placer`) before its answer. A pipeline adopted
from a replica that died before recording it is placed anew here too. The service shell
(orchestrator/service.py) owns the connection and the pipelines."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from nats.micro.request import Request

from orchestrator.api.users import as_user, user_of
from orchestrator.infra import eventloop
from orchestrator.placement.placer import PlacementFailed
from orchestrator.placement.pricing import OverBudget
from orchestrator.scheduling import Unschedulable
from orchestrator.state import lifecycle
from orchestrator.state.pipelines import PipelineRun
from schemas.api import SubmitReply, SubmitRequest
from schemas.codec import encoding_of, error_reply
from schemas.errors import ServiceError
from schemas.pipeline import PipelineSpec
from transport.rpc import handle, let_sends_out

if TYPE_CHECKING:
    from orchestrator.ports import SubmissionsDoor

log = logging.getLogger("mars.orchestrator")
#: One debug record per placement with the time of each step (MARS_DEBUG=mars.timing).
timing_log = logging.getLogger("mars.timing")
#: ... its format (benchmarks/placement_latency.py reads it back).
TIMING_LINE = (
    "placed %s claim_ms=%.3f plan_ms=%.3f send_ms=%.3f book_ms=%.3f offer_ms=%.3f "
    "total_ms=%.3f budget_ms=%.1f conflicts=%d rejections=%d held_ms=%.3f start_mono=%.6f"
)
#: Submissions one process serves at once. The planner stays one at a time (`Placer`); the
#: next submission's claim, and its wait for the planner, overlap the one before's offers,
#: commit and reply. Four at once shorten the wait of random arrivals when the host is fast
#: and lengthen their placements when it is slow (docs/placement-latency.md).
SUBMITS_AT_ONCE = 2
#: Submissions waiting for one of those at most; one more is answered `unavailable` at once
#: (the client hears "busy, try again", not a timeout).
MAX_QUEUED_SUBMITS = 1024
#: A submission whose client will have given up within this long (or a quarter of its
#: timeout, if less) is not served: see `SubmitRequest.timeout_ms`.
STALE_MARGIN_S = 0.5
#: An adopted pipeline waiting for an agent looks at its lease at least this often.
AGENT_WAIT_LOOK_S = 2.0


class Submissions:
    """One replica's submissions: the queue, its workers (started by the shell) and the
    placement of each new pipeline."""

    def __init__(self, o: SubmissionsDoor, max_queued: int = MAX_QUEUED_SUBMITS) -> None:
        self.o = o
        #: Submissions waiting to be served, each with when it arrived (monotonic clock); at
        #: most `max_queued` beyond those the idle workers are about to take.
        self.queue: asyncio.Queue[tuple[float, Request]] = asyncio.Queue()
        self.max_queued = max_queued
        self._idle_workers = 0
        #: Submissions not served because their client had given up (`SubmitRequest.timeout_ms`)
        #: or refused because the queue was full.
        self.stale = 0
        self.refused = 0
        #: Ids being submitted now: the same id submitted again meanwhile waits for the first.
        self.submitting: dict[str, asyncio.Event] = {}

    async def enqueue(self, req: Request) -> None:
        """The submit endpoint: each request is queued with when it arrived, for the
        SUBMITS_AT_ONCE workers (`worker`); one beyond MAX_QUEUED_SUBMITS is refused
        at once. Queued here rather than in the client library, a request's wait is known."""
        waiting = self.queue.qsize() - self._idle_workers
        if waiting >= self.max_queued:
            self.refused += 1
            await refuse(req, f"{waiting} submissions are waiting here; try again soon")
            return
        self.queue.put_nowait((self.o.mono(), req))

    async def worker(self) -> None:
        queue = self.queue
        while True:
            self._idle_workers += 1
            try:
                arrived, req = await queue.get()
            finally:
                self._idle_workers -= 1
            try:
                served = functools.partial(self._as_sent, subject=req.subject, arrived=arrived)
                body, headers = await handle(req.data, req.headers, SubmitRequest, served)
                await req.respond(body, headers=headers)
            except Exception as exc:  # the requester times out; the service stays up
                log.warning("could not answer a request on %s: %s", req.subject, exc)

    async def _as_sent(self, req: SubmitRequest, subject: str, arrived: float) -> SubmitReply:
        """A submission as the subject it came on says whose it is (`users.py`)."""
        return await self.submit(as_user(req, user_of(subject)), arrived=arrived)

    async def _check_fresh(self, req: SubmitRequest, arrived: float | None) -> None:
        """Refuse to serve a submission whose client has given up on it, or will have before
        it can be answered (`SubmitRequest.timeout_ms`, counted from its arrival here)."""
        if arrived is None or req.timeout_ms is None:
            return
        timeout = req.timeout_ms / 1e3
        waited = self.o.mono() - arrived
        if waited < timeout - min(STALE_MARGIN_S, timeout / 4):
            return
        self.stale += 1
        await self.o.notify_changed()
        log.info(
            "submission %s not served: it waited %.0f ms of its client's %d",
            req.pipeline_id or "(no id)", 1e3 * waited, req.timeout_ms,
        )  # fmt: skip
        raise ServiceError(
            "unavailable",
            f"waited {1e3 * waited:.0f} ms here of the {req.timeout_ms} ms its client waits: "
            "not placed; submit it again (with a pipeline_id, a retry is never placed twice)",
        )

    async def submit(self, req: SubmitRequest, arrived: float | None = None) -> SubmitReply:
        """Serve a submission; `arrived`: when it reached this process (monotonic clock),
        for a request that says how long its client waits."""
        await self._check_fresh(req, arrived)
        pid = req.pipeline_id or uuid.uuid4().hex
        while (first := self.submitting.get(pid)) is not None:
            await first.wait()  # the same id twice at once: answered as the first ended
        self.submitting[pid] = done = asyncio.Event()
        try:
            return await self._submit(req, pid, arrived)
        finally:
            del self.submitting[pid]
            done.set()

    async def _submit(self, req: SubmitRequest, pid: str, arrived: float | None) -> SubmitReply:
        existing = self.o.pipelines.get(pid)
        if existing is not None:
            if existing.spec != req.pipeline:
                raise ServiceError("conflict", f"pipeline id {pid} exists with another spec")
            return self.reply(existing)
        t_in = time.perf_counter()  # CLOCK_MONOTONIC on Linux: one clock for the whole host
        if await self.o.catch_up_events():
            await self._check_fresh(req, arrived)  # held back by events for a while: still wanted?
        # what it fetches from the store is there, or it is refused now, not failed when run
        sizes = await self.o.stored.check(req.pipeline) if self.o.stored is not None else {}
        t0 = time.perf_counter()
        run = PipelineRun(
            pid, req.pipeline, self.o.mono(), submitted_wall=self.o.wall(), owner=self.o.owner,
            artifact_sizes=sizes,
        )  # fmt: skip
        lifecycle.step(run, lifecycle.Placing(), self.o.mono())
        # The ownership claim goes out first and is awaited only before booking, so its
        # round trip overlaps planning; the run is remembered once the claim is ours.
        claim = asyncio.ensure_future(self.own(run))
        await let_sends_out()
        try:
            return await self._place_new(run, claim, t_in, t0)
        except OwnedElsewhere as other:
            return other.reply  # lost the claim: nothing was booked or offered
        finally:
            await self.o.failover.spec_saved(pid)  # a write begun is never left behind

    async def place_anew(self, pid: str, spec: PipelineSpec, why: str) -> None:
        """Place a pipeline this replica has just taken over with no record of it (answered
        by a replica that died before recording it), as a new submission under the lease
        already held: `why` goes to its log first, a failure is the pipeline's end (recorded and
        published, as a submission's)."""
        t, o = time.perf_counter(), self.o
        run = PipelineRun(pid, spec, o.mono(), submitted_wall=o.wall(), owner=o.owner)
        lifecycle.step(run, lifecycle.Placing(why), o.mono())
        self.o.remember(run)
        try:
            await self._place_new(run, None, t, t, anew=True)
        except ServiceError as exc:
            log.warning("pipeline %s, placed anew, not placed: %s", pid, exc.message)

    async def _place_once_an_agent_is_up(self, run: PipelineRun) -> None:
        """An adopted pipeline placed anew while no agent was up waits, its lease renewed,
        until one is (or it is cancelled, or lost to another replica), then is placed anew."""
        pid, o = run.pipeline_id, self.o
        log.info("pipeline %s adopted with no agent up: placed anew once one is", pid)
        while True:
            o.cluster_changed.clear()  # before looking: an advert from now on wakes us
            if o.pipelines.get(pid) is not run or run.terminal or not o.failover.holds(pid):
                return
            if o.failover.may_act(pid) and o.view.alive(o.mono()):
                break
            # the lease is looked at again meanwhile
            await eventloop.wait_event(o.cluster_changed, AGENT_WAIT_LOOK_S)
        await self.place_anew(pid, run.spec, "an agent is up: placed anew")

    async def _place_new(
        self,
        run: PipelineRun,
        claim: asyncio.Future[None] | None,
        t_in: float,
        t0: float,
        anew: bool = False,
    ) -> SubmitReply:
        """Plan, book, offer and commit a new pipeline (`claim`: its ownership claim, awaited
        before anything is booked; None: its lease is held already) and answer for it.
        `anew`: a replica that died placed it before: each of its tasks is placed as moving
        (the windows booked for it then are dropped from every key its new plan writes, and
        not in its way), and offered under a token (replacing what is queued for it)."""
        pid, o = run.pipeline_id, self.o
        try:
            await o.placer.place(run, only=set(run.tasks) if anew else None, gate=claim)
            failed: PlacementFailed | None = None
        except PlacementFailed as exc:
            failed = exc
        except BaseException as exc:
            if claim is not None and not claim.done():
                claim.cancel()
                with contextlib.suppress(BaseException):
                    await claim
            if isinstance(exc, Exception) and o.pipelines.get(pid) is run:
                await self._abandon(run, anew, exc)
                raise ServiceError(
                    "unavailable",
                    f"placing {pid} failed part-way ({type(exc).__name__}: {exc}); nothing of "
                    "it was kept: submit it again",
                ) from exc
            raise
        if claim is not None:
            await claim  # a plan can fail before the gate: whose pipeline is it?
        if failed is not None:
            return await self._not_placed(run, failed, claim is not None, anew)
        if not anew and not await o.failover.spec_written(run):
            await self._spec_unwritten(run)
        return await self._committed(run, t_in, t0)

    async def _not_placed(
        self, run: PipelineRun, failed: PlacementFailed, claimed: bool, anew: bool
    ) -> SubmitReply:
        """A placement that failed: answered as the pipeline's end (unschedulable, or
        failed), or, when no agent was up, put off (adopted) or refused with its id left
        free (new); raises the error its client is answered with."""
        pid, o = run.pipeline_id, self.o
        cause = failed.__cause__
        unsched = isinstance(cause, Unschedulable)
        if isinstance(cause, Unschedulable) and cause.no_devices and (anew or claimed):
            # no agent up when it was planned (a site restarting, a fleet not back yet;
            # judged by what the plan saw: one may be back by now): not this pipeline's
            # fault. A new one's id is left free for a retry (refused as unschedulable, it
            # was ended, and every resubmit answered with that end); one adopted is left
            # where it is, under the lease held, and placed anew once an agent is up (ended,
            # its client was told it failed for the outage; let go, it was adopted again
            # every few seconds, a warning each time, until one was)
            if anew:  # (its adopter gives back what the dead owner booked for it)
                await o.placer.withdrawn(pid)  # before the next placement's offers
                run.note("no agent is up: placed anew once one is")
                o.spawn(self._place_once_an_agent_is_up(run))
                await o.notify_changed()
                return self.reply(run)
            await self._abandon(run, False, failed)
            raise ServiceError(
                "unavailable",
                "no agent is up: nothing was placed, and the pipeline id is free; "
                "submit it again once agents are back",
            ) from failed
        # a pipeline that does not fit the fleet is the submitter's news (info); one lost
        # to conflicts or rejections round after round is the operator's (warning)
        log.log(
            logging.INFO if unsched else logging.WARNING,
            "pipeline %s not placed: %s (%s)", pid, failed,
            "; ".join(f"{k}: {v}" for k, v in list(failed.details.items())[:8]),
        )  # fmt: skip
        await o.placer.withdrawn(pid)  # its offers are withdrawn before its client is told
        ended = lifecycle.step(run, lifecycle.NotPlaced(unsched, str(failed)), o.mono())
        await o.carry_out(run, ended)
        if isinstance(cause, OverBudget):  # nothing of it was booked or offered
            raise ServiceError("over_budget", str(cause), cause.details()) from failed
        raise ServiceError(
            "unschedulable" if unsched else "conflict", str(failed)[:2048], failed.details
        ) from failed

    async def _spec_unwritten(self, run: PipelineRun) -> None:
        """Answered without its spec on the bucket, it could be adopted as never answered (no
        spec, no record yet) and its id freed while its client waits for its end (JetStream
        is slow for a few seconds after a server restart): not committed, what it booked and
        was offered goes back, and its client asks again."""
        pid, o = run.pipeline_id, self.o
        unwritten = ServiceError(
            "unavailable",
            f"placing {pid}: its spec could not be written; nothing of it was kept: "
            "submit it again",
        )
        await o.cancel_tasks(
            run, dict(run.placements), "its spec could not be written",
            max_token=max((tr.token for tr in run.tasks.values()), default=0),
        )  # fmt: skip
        await self._abandon(run, False, unwritten)
        raise unwritten

    async def _committed(self, run: PipelineRun, t_in: float, t0: float) -> SubmitReply:
        """Commit a placed pipeline and answer for it."""
        pid, o = run.pipeline_id, self.o
        # The plan is committed once booked and accepted: starting the tasks (the commit
        # messages, looked after until each agent shows it has them) and the record are off
        # the reply's path, and begin once the reply is written (tasks spawned now would run
        # before it); status falls back to memory meanwhile.
        committed = lifecycle.step(run, lifecycle.Committed(), o.mono())
        await o.carry_out(run, committed, answering=True)
        # (its spec is on the bucket before anyone is told of it, above: begun with the claim,
        # long written by now; an adopter that finds no record places it anew)
        reply = self.reply(run)
        if timing_log.isEnabledFor(logging.DEBUG):
            st = run.step_s
            timing_log.debug(
                TIMING_LINE, pid,
                1e3 * st.get("claim", 0.0), 1e3 * st.get("plan", 0.0), 1e3 * st.get("send", 0.0),
                1e3 * st.get("book", 0.0), 1e3 * st.get("offer", 0.0),
                1e3 * (time.perf_counter() - t0), 1e3 * st.get("budget", 0.0), run.conflicts,
                run.rejections, 1e3 * (t0 - t_in), t_in,
            )  # fmt: skip
        return reply

    async def _abandon(self, run: PipelineRun, anew: bool, why: Exception) -> None:
        """A placement given up, not failed: NATS or JetStream went away mid-booking (`why`
        any exception), or no agent was up for a new submission (`why` a PlacementFailed;
        an adopted one waits for an agent instead). Not left "placing" for
        ever (its lease renewed, every resubmit answered with it): what it booked goes back
        (or expires, renewed no more), agents drop what they were offered (never committed,
        its status unknown). A new submission frees its id: its client is told `unavailable`
        and submits again. One placed anew (its client answered long ago) is let go
        unrecorded: its lease lapses and a replica adopts it, placing it anew."""
        pid, o = run.pipeline_id, self.o
        level = logging.INFO if isinstance(why, PlacementFailed) else logging.WARNING
        log.log(level, "placing %s given up (%r): nothing of it kept", pid, why)
        # Out of sight before anything is awaited: a resubmit given to another replica asks
        # the lease's holder, which would answer from this run while it is given up
        # ("placing"), and its client would wait for an end that never comes
        o.pipelines.pop(pid, None)
        await o.placer.withdrawn(pid)  # before a resubmit's offers, which it would withdraw
        o.failover.give_back_strays(pid, keep=())
        if anew:
            o.failover.let_go(pid)
        else:
            with contextlib.suppress(Exception):
                await o.failover.forget_unplaced(pid)
        await o.notify_changed()

    async def own(self, run: PipelineRun) -> None:
        """Claim a new pipeline's ownership lease and remember the run; OwnedElsewhere when
        another replica holds it (carrying that replica's answer)."""
        elsewhere = await self.o.failover.claim(run.pipeline_id, run.spec)
        if elsewhere is not None:
            raise OwnedElsewhere(elsewhere)
        self.o.failover.save_spec(run)
        self.o.remember(run)

    def reply(self, run: PipelineRun) -> SubmitReply:
        return SubmitReply(
            pipeline_id=run.pipeline_id,
            state=run.state,
            algorithm=run.algorithm,
            makespan_s=run.planned_makespan_s,
            plan=run.plan,
            cost=run.planned_cost,
        )


async def refuse(req: Request, why: str) -> None:
    """Answer a request `unavailable` with `why`."""
    body, headers = error_reply("unavailable", why, None, encoding_of(req.headers))
    with contextlib.suppress(Exception):  # the requester may be gone
        await req.respond(body, headers=headers)


async def after_reply(work: Coroutine[Any, Any, None]) -> None:
    """`work`, once the reply being sent now is on the wire: nats-py writes it at the loop's
    next turn, after whatever was scheduled before it."""
    try:
        await let_sends_out()
    except BaseException:
        work.close()  # stopped first: never started, and never left unawaited
        raise
    await work


class OwnedElsewhere(Exception):
    """A submitted pipeline id is owned by another replica: answer with its reply."""

    def __init__(self, reply: SubmitReply) -> None:
        super().__init__(f"pipeline {reply.pipeline_id} is owned elsewhere")
        self.reply = reply
