"""Optimistic placement: plan on the cached view, book each device by CAS, offer, commit.

Correctness comes only from compare-and-set on each device's reservation key, never from the
cached read. On a CAS conflict only the devices that moved are refreshed and only the tasks
they affect (and their descendants) are re-planned, with everything else held fixed; an
agent's rejection rules that (task, device) out and re-plans the same way. Bounded rounds;
every conflict and rejection is logged on the pipeline with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.placement.budget import plan_budget
from orchestrator.placement.planning import MIN_TASK_S, Planned, plan_pipeline
from orchestrator.placement.pricing import OverBudget
from orchestrator.reservations.book import Blocking, effective_priority
from orchestrator.reservations.store import BookResult, device_key, device_of_key
from orchestrator.scheduling import Placement, Unschedulable
from orchestrator.scheduling.engine import NO_COMPUTE_TIME
from orchestrator.state import lifecycle
from orchestrator.state.pipelines import PipelineRun
from schemas import subjects
from schemas.api import PlannedTask
from schemas.bookings import BookingWindow
from schemas.placement import CancelCommand, ConsumerRef, InputRef, OfferReply, TaskOffer
from transport.rpc import let_sends_out

if TYPE_CHECKING:
    from orchestrator.ports import PlacerDoor

log = logging.getLogger("mars.placement")
MAX_ROUNDS = 8
#: Refusals saying the placement being replaced has started on its agent: the task keeps it
#: (its result on the way counts; its consumers fetch its output, or are sent it when it ends).
STARTED = {"already_ran", "already_running"}
DEVICE_WIDE = {"unhealthy", "draining", "stale_incarnation", "unknown_device", "no_capacity"}


class PlacementFailed(Exception):
    def __init__(self, message: str, details: dict[str, str]) -> None:
        super().__init__(message)
        self.details = details


def _reach(roots: Iterable[str], step: Callable[[str], Iterable[str]]) -> set[str]:
    """Every task reached from `roots` by `step`, `roots` included."""
    out: set[str] = set()
    stack = list(roots)
    while stack:
        tid = stack.pop()
        if tid not in out:
            out.add(tid)
            stack.extend(step(tid))
    return out


def ancestors(run: PipelineRun, roots: Iterable[str]) -> set[str]:
    """Every task that feeds one of `roots`, directly or not (`roots` themselves left out)."""
    roots = set(roots)
    return _reach(roots, lambda t: run.spec_by_id[t].deps) - roots


def descendants(run: PipelineRun, roots: Iterable[str]) -> set[str]:
    """`roots` and every task that they feed, directly or not."""
    return _reach(roots, run.children.__getitem__)


@dataclass
class Round:
    """What one placement attempt holds across rounds."""

    t0: float
    fixed: dict[str, Placement] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    excluded: set[tuple[str, str]] = field(default_factory=set)
    sent: dict[str, TaskOffer] = field(default_factory=dict)
    #: Devices left out because their booking key is full, each with why.
    full: dict[str, str] = field(default_factory=dict)
    #: Producers not being placed whose agents refused to hear where their consumers went
    #: (`duplicate`: they ended, or run, there already): their consumers fetch the output.
    ended: set[str] = field(default_factory=set)
    #: Tasks being placed again: (their placement, token and agent before).
    prior: dict[str, tuple[Placement, int, str]] = field(default_factory=dict)
    #: Of those, tasks their agent had already started (or run) under the placement before:
    #: kept as they were (a start in a task's first `started_event_after_s` is not reported,
    #: so a task this replica holds as waiting may be running or have run; its end is on
    #: its way).
    kept: set[str] = field(default_factory=set)
    #: The claim on the pipeline, awaited before anything is booked or offered (once).
    gate: Awaitable[object] | None = None
    #: Why each device was left out or lost (what a failed placement reports).
    reasons: dict[str, str] = field(default_factory=dict)
    #: Seconds spent per step over the rounds (`PipelineRun.step_s`).
    steps: dict[str, float] = field(default_factory=dict)


@dataclass
class Attempt:
    """One round of a placement: its plan, and what its phases made of it."""

    rnd: int
    now: float
    planned: Planned
    #: the tasks this round places (the plan's, less those held fixed), and every placement
    todo: dict[str, Placement]
    placements: dict[str, Placement]
    order: dict[str, int]
    #: the windows it books, by device key
    by_key: dict[str, list[BookingWindow]]
    #: its offers, and (a first placement's, sent with its bookings) their answers
    offers: dict[str, TaskOffer] = field(default_factory=dict)
    offered: asyncio.Future[list[OfferReply]] | None = None
    #: keys whose CAS it lost
    bad: set[str] = field(default_factory=set)


@dataclass
class Asked:
    """Every offer one placement sent, whatever its answer: what a failed first placement
    withdraws (`Placer._withdraw`)."""

    #: (agent, task) -> the highest token offered there
    tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the answers to them, awaited before anything is withdrawn (a withdrawal overtaking
    #: its offer at the agent would withdraw nothing)
    answers: list[asyncio.Future[list[OfferReply]]] = field(default_factory=list)


class Placer:
    def __init__(self, orch: PlacerDoor) -> None:
        self.o = orch
        # Plan-and-book is serialised inside one process (it takes milliseconds): placements
        # of one replica then never race each other, and CAS only arbitrates between replicas.
        self._booking = asyncio.Lock()
        #: placements under way in this process
        self.placing = 0
        #: pipeline -> the withdrawal of a failed first placement's offers under way
        #: (`withdrawn`)
        self._withdrawals: dict[str, asyncio.Task[None]] = {}

    def budget_s(self, tasks: int) -> float:
        """The portfolio's time beyond HEFT for the next plan, of `tasks` tasks: all of it
        (`budget.plan_budget`) when this placement is the only one under way, none while
        others are (they queue behind the planner, so under load plans come sooner rather
        than better; HEFT's are still link-aware)."""
        return plan_budget(self.o.plan_budget_s, tasks) if self.placing <= 1 else 0.0

    async def place(
        self,
        run: PipelineRun,
        only: set[str] | None = None,
        exclude: set[tuple[str, str]] | None = None,
        gate: Awaitable[object] | None = None,
    ) -> None:
        """Place `only` these tasks (default: all), everything else staying where it is;
        never a task on a device of `exclude`'s (task, device) pairs. `gate` (the ownership
        claim of a new pipeline, sent before planning so its round trip overlaps the plan) is
        awaited before anything is booked; whatever it raises ends the placement.

        A first placement (`only` None) that fails, however (unplaceable, out of rounds, an
        error part-way), withdraws every offer it sent from every agent it sent one to
        (`withdrawn` says when that has been sent); what it booked is given back by its
        caller (the run's end, or `Failover.give_back_strays`)."""
        self.placing += 1
        asked = Asked()
        try:
            await self._place(run, only, exclude, gate, asked)
        except BaseException:
            if only is None and asked.tokens:
                self._withdrawals[run.pipeline_id] = self.o.spawn(self._withdraw(run, asked))
            raise
        finally:
            self.placing -= 1

    def _ask(self, asked: Asked, offers: list[TaskOffer]) -> asyncio.Future[list[OfferReply]]:
        """`Orchestrator.start_offers`, noting what was offered where."""
        for x in offers:
            k = (x.agent_id, x.task.id)
            asked.tokens[k] = max(asked.tokens.get(k, 0), x.token)
        answers = self.o.start_offers(offers)
        asked.answers.append(answers)
        return answers

    async def _place(
        self,
        run: PipelineRun,
        only: set[str] | None,
        exclude: set[tuple[str, str]] | None,
        gate: Awaitable[object] | None,
        asked: Asked,
    ) -> None:
        """The retry driver: rounds of reserve, permit and bind, until one binds; what a
        round loses is unreserved by the phase that found it and planned again."""
        st = Round(t0=run.t0 if run.t0 else self.o.wall(), gate=gate)
        st.excluded.update(exclude or ())
        run.t0 = st.t0
        if only is not None:
            st.fixed = {tid: p for tid, p in run.placements.items() if tid not in only}
            st.tokens = {tid: tr.token for tid, tr in run.tasks.items() if tid not in only}
            st.prior = {
                t: (run.placements[t], tr.token, tr.agent_id) for t in only
                if t in run.placements and (tr := run.tasks[t]).token and tr.agent_id
            }  # fmt: skip
        st.steps = run.step_s = {
            "claim": 0.0, "plan": 0.0, "send": 0.0, "book": 0.0, "offer": 0.0, "budget": 0.0
        }  # fmt: skip
        for rnd in range(MAX_ROUNDS):
            if only is not None and run.terminal:
                raise PlacementFailed(f"the pipeline has ended ({run.state})", {})
            att = await self._reserve(run, st, rnd, only, asked)
            if only is not None and run.terminal:
                # it ended while this round booked (its last task's end heard meanwhile: the
                # end gave back what it held then, not this): nothing is offered, and what
                # was booked goes back now, not when its lease runs out
                for key in sorted(k for k in att.by_key if k not in att.bad):
                    self.o.store.defer_release(key, run.pipeline_id, self.o.wall())
                raise PlacementFailed(f"the pipeline ended while placed ({run.state})", {})
            if not await self._permit(run, st, att, asked):
                continue
            if not await self._bind(run, st, att, only, asked):
                continue
            return
        raise PlacementFailed(f"no placement after {MAX_ROUNDS} rounds", st.reasons)

    def _plan(
        self, run: PipelineRun, st: Round, now: float, blocks: Blocking, first: bool = False
    ) -> Planned:
        """Plan the round on the cached view and reservations (under the booking lock). Only
        a `first` placement is refused for its budget (`pricing.OverBudget`): one placed again
        (recovery, eviction, adoption) keeps its objective but runs on, at the cheapest plan
        found when none fits."""
        o, spec = self.o, run.spec
        excluded = st.excluded
        if o.store.full:  # devices whose queue of booked windows is as deep as allowed
            full = o.store.full_devices(now, room=blocks)
            st.full.update(full)
            excluded = excluded | {(t.id, d) for d in full for t in spec.tasks}
        try:
            return plan_pipeline(
                spec, o.view, o.mono(), bookings=o.store.snapshot(), t0=st.t0,
                blocks=blocks, excluded=excluded,
                fixed=st.fixed,
                rel_now=max(0.0, now - st.t0), budget_s=st.steps["budget"],
                predictor=o.predictor, measured=run.measured_bytes(), reads=run.reads,
                refuse_over_budget=first,
            )  # fmt: skip
        except Unschedulable as exc:
            if st.full and not isinstance(exc, OverBudget):  # which refusals were full devices
                exc = Unschedulable({
                    t: {d: st.full.get(d, why) if why == NO_COMPUTE_TIME else why
                        for d, why in per.items()}
                    for t, per in exc.reasons.items()
                })  # fmt: skip
            details = {f"{t}@{d}": why for t, per in exc.reasons.items() for d, why in per.items()}
            details.update(st.reasons)
            raise PlacementFailed(str(exc), dict(list(details.items())[:500])) from exc

    async def _reserve(
        self, run: PipelineRun, st: Round, rnd: int, only: set[str] | None, asked: Asked
    ) -> Attempt:
        """Reserve: plan, then book every involved device by CAS (a first placement's offers
        go out with its bookings). What each key said is applied: tokens and windows where
        it was won, the key left out where it is full, a conflict noted where it was lost."""
        o, spec, steps, clock = self.o, run.spec, st.steps, time.perf_counter
        now = o.wall()
        eff = effective_priority(spec.priority, run.submitted_wall, now)
        async with self._booking:
            steps["budget"] = self.budget_s(len(spec.tasks))
            t_plan = clock()
            # the windows of tasks held where they are stay, and the write would refuse
            # a plan through them (a producer placed again beside its own booked consumer
            # lost every round to that window)
            blocks = Blocking(run.pipeline_id, eff, now, frozenset(st.fixed))
            planned = self._plan(run, st, now, blocks, first=only is None)
            plan = planned.plan
            steps["plan"] += clock() - t_plan
            t_build = clock()
            todo = {t: p for t, p in plan.placements.items() if t not in st.fixed}
            placements = {**st.fixed, **todo}
            by_key: dict[str, list[BookingWindow]] = {}
            ends = window_ends(plan.placements, todo)
            for tid, p in todo.items():
                agent_id, dev_id = p.device_id.split(":", 1)
                by_key.setdefault(device_key(agent_id, dev_id), []).append(BookingWindow(
                    pipeline_id=run.pipeline_id, task_id=tid, slot=p.slot,
                    start=st.t0 + p.start, end=st.t0 + ends[tid],
                    expires=now + o.lease_s, owner=o.owner, priority=spec.priority,
                    preemptible=spec.preemptible, submitted=run.submitted_wall,
                    evictions=run.evictions.get(tid, 0),
                ))  # fmt: skip
            att = Attempt(rnd, now, planned, todo, placements, plan_order(placements), by_key)
            # A first placement is offered while its bookings are written (token 0, the
            # commit brings each task's token): admission and CAS in one round trip. Any
            # later round books first and offers with the token. The offers go out first:
            # an agent's answer takes longer than a CAS (another process decides it).
            provisional = rnd == 0 and only is None and not st.fixed
            if provisional:
                att.offers = {
                    tid: self._offer(run, tid, placements, st, att.order, provisional=True)
                    for tid in todo
                }  # fmt: skip
            # each key's new value, encoded, while the claim may still be on its way
            # (written as is unless the key moved meanwhile)
            evictable = blocks.evictable
            keys = sorted(by_key)
            # tasks placed again: their old windows go from every key written, or a task
            # moving onto a slot another one of them leaves would lose its CAS to it
            moving = [(run.pipeline_id, t) for t in todo] if only is not None else []
            ready = [
                o.store.prepare(k, o.store.booking(by_key[k], now, evictable, moving)) for k in keys
            ]
            steps["send"] += clock() - t_build
            if st.gate is not None:
                # our claim on the pipeline: nothing is offered or booked before it (what
                # they carry is built already, while its answer may still be on its way)
                t_gate = clock()
                await st.gate
                st.gate = None
                steps["claim"] = clock() - t_gate
            t_book = clock()
            if provisional:
                att.offered = self._ask(asked, list(att.offers.values()))
                await let_sends_out()  # on the wire before the CAS writes are made
                t_sent = clock()
                steps["send"] += t_sent - t_book
                t_book = t_sent
            booking = asyncio.gather(*(
                o.store.book(k, by_key[k], now, evictable, prepared, moving)
                for k, prepared in zip(keys, ready, strict=True)
            ))  # fmt: skip
            results: list[BookResult] = await booking
            steps["book"] += clock() - t_book
        run.cas_retries += sum(r.cas_retries for r in results)
        att.bad = {r.key for r in results if not r.ok}
        for r in results:
            if r.ok:
                for w in by_key[r.key]:
                    st.tokens[w.task_id] = r.token
                    run.windows[w.task_id] = (r.key, w.start, w.end)
                if r.evicted:
                    await o.displaced.notify_evicted(r.key, r.evicted, run.pipeline_id)
            elif r.full:  # booking more there would pass the key's limit: plan elsewhere
                dev = device_of_key(r.key)
                st.full[dev] = r.full
                st.excluded.update((t.id, dev) for t in spec.tasks)
                run.note(f"round {rnd}: {r.key} refused it ({r.full}); re-planning elsewhere")
                st.reasons[f"full@{r.key}"] = r.full
            else:
                run.conflicts += 1
                who = ", ".join(sorted({f"{w.pipeline_id}/{w.task_id}" for w in r.conflicts}))
                run.note(f"round {rnd}: conflict on {r.key} with {who}; re-planning")
                st.reasons[f"conflict@{r.key}"] = f"round {rnd}: lost to {who}"[:2048]
        return att

    async def _permit(self, run: PipelineRun, st: Round, att: Attempt, asked: Asked) -> bool:
        """Permit: every new placement offered to its agent (admission), unless offered with
        its bookings already. False when the round must be planned again: a key was lost, an
        agent said no, or a task being placed again had started where it was (kept there);
        what that affects is unreserved first."""
        rnd, todo, spec, clock = att.rnd, att.todo, run.spec, time.perf_counter
        t_offer = clock()
        if att.offered is None:
            if att.bad:
                replies: list[OfferReply] = []
            else:
                att.offers = {
                    tid: self._offer(run, tid, att.placements, st, att.order) for tid in todo
                }  # fmt: skip
                replies = await self._ask(asked, list(att.offers.values()))
        else:
            replies = await att.offered
        st.steps["offer"] += clock() - t_offer
        offers = att.offers
        rejected = [rep for rep in replies if not rep.accepted]
        for rep in replies:
            if rep.accepted:
                st.sent[rep.task_id] = offers[rep.task_id]
        started = {
            rep.task_id: rep.code for rep in rejected
            if rep.code in STARTED and offers[rep.task_id].replaces
        }  # fmt: skip
        for t, code in sorted(started.items()):
            did = "already ran" if code == "already_ran" else "is running"
            run.note(f"round {rnd}: {t} {did} on {st.prior[t][2]}; kept as it was")
        ran = set(started)
        # A task that has started had every input: what feeds it has ended, and is kept
        # as it was wherever this round placed it (an offer to another agent cannot be
        # told it ran already). Not when this round's offer took its place: accepted by
        # the agent of its last placement, it replaced that job, and once withdrawn
        # nothing would be left to run or end under the kept placement; it runs again
        # where the round put it.
        for t in sorted(ancestors(run, started) & set(todo) - ran):
            if t not in st.prior:
                continue
            if t in st.sent and offers[t].agent_id == st.prior[t][2]:
                run.note(
                    f"round {rnd}: {t} has ended (what it feeds started), but this round's "
                    f"offer took its place on {offers[t].agent_id}: it runs there again"
                )
                continue
            ran.add(t)
            run.note(f"round {rnd}: {t} has ended (what it feeds started); kept as it was")
        rejected = [rep for rep in rejected if rep.task_id not in ran]
        for rep in rejected:
            run.rejections += 1
            dev = todo[rep.task_id].device_id
            st.excluded.add((rep.task_id, dev))
            if rep.code in DEVICE_WIDE:
                st.excluded.update((t.id, dev) for t in spec.tasks)
            msg = f"{rep.code}: {rep.reason}"
            st.reasons[f"{rep.task_id}@{dev}"] = msg
            run.note(
                f"round {rnd}: {rep.agent_id} rejected {rep.task_id} ({msg}); re-planning elsewhere"
            )
        if not (att.bad or rejected or ran):
            return True
        moved = {w.task_id for k in att.bad for w in att.by_key[k]}
        moved |= {rep.task_id for rep in rejected} | ran
        await self._unreserve(
            run, st, att, moved, "re-planned after a " + ("rejection" if rejected else "conflict")
        )
        for t in ran:  # as before this placement: its consumers fetch its output
            st.fixed[t], st.tokens[t], _ = st.prior[t]
            st.kept.add(t)
            st.ended.add(t)
            self.o.displaced.started_unheard(run.pipeline_id, t, st.tokens[t])
        return False

    async def _unreserve(
        self, run: PipelineRun, st: Round, att: Attempt, moved: set[str], why: str
    ) -> None:
        """Unreserve: the tasks `moved` and what they feed give their windows of this round
        back and have their offers withdrawn; the rest of the round is held for the next."""
        todo = att.todo
        affected = descendants(run, moved) & set(todo)
        await self._release(run, att.by_key, affected, att.bad)
        withdrawn = {t: todo[t] for t in affected if t in st.sent}
        if withdrawn:
            await self.o.cancel_tasks(
                run, withdrawn, why, max_token=max(st.sent[t].token for t in withdrawn)
            )
        for t in affected:
            st.sent.pop(t, None)
        for tid, p in todo.items():
            if tid not in affected:
                st.fixed[tid] = p

    async def _bind(
        self, run: PipelineRun, st: Round, att: Attempt, only: set[str] | None, asked: Asked
    ) -> bool:
        """Bind: offers whose routing changed since they were accepted are sent again, and
        the round becomes the pipeline's placement. False when an agent refused such an
        offer: that task and what it feeds are unplaced, and the round planned again."""
        rnd, todo, placements, spec = att.rnd, att.todo, att.placements, run.spec
        order, clock = att.order, time.perf_counter
        if only is None and not st.fixed:
            final = att.offers  # every task was offered in this round, as planned: none differs
        else:
            if only is None:
                final_ids = set(placements)
            else:
                final_ids = set(only) | {
                    d for t in only for d in spec.tasks[run.index[t]].deps
                    if run.tasks[d].state in ("offered", "accepted")
                }  # fmt: skip
            final = {
                tid: self._offer(run, tid, placements, st, order)
                for tid in final_ids - st.kept
            }  # fmt: skip
        stale = [x for tid, x in final.items() if tid in st.sent and st.sent[tid] != x]
        stale += [x for tid, x in final.items() if tid not in st.sent and tid not in todo]
        if stale:
            t_offer = clock()
            again = await self._ask(asked, stale)
            # A producer placed before this placement that cannot be told where its
            # consumers went: it ended (or started) at its agent before its end was heard
            # here (`duplicate`: it sent its output to where they were), or its agent
            # began draining, restarted, or does not answer. Re-planning would change
            # none of that. Their new offers say its output is ready, so their agents
            # fetch it at commit: sent at once if it is there, pushed when the producer
            # ends if it has not, reported gone if nobody holds it.
            refusals = {
                rep.task_id: rep for rep in again
                if not rep.accepted and rep.task_id not in todo and rep.task_id not in st.sent
            }  # fmt: skip
            ended = set(refusals)
            if ended:
                st.ended |= ended
                done = sorted(t for t, rep in refusals.items() if rep.code == "duplicate")
                if done:
                    run.note(
                        f"round {rnd}: {', '.join(done)} already ended or running on "
                        "their agents; their consumers fetch the output"
                    )
                for t, rep in sorted(refusals.items()):
                    if rep.code != "duplicate":
                        run.note(
                            f"round {rnd}: {t} on {rep.agent_id} was not told where its "
                            f"consumers went ({rep.code}: {rep.reason[:200]}); they fetch "
                            "its output"
                        )
                fed = {c for d in ended for c in run.children[d] if c in final and c in todo}
                final.update({c: self._offer(run, c, placements, st, order) for c in fed})
                again = [r for r in again if r.task_id not in ended]
                told = await self._ask(asked, [final[c] for c in sorted(fed)])
                st.sent.update({r.task_id: final[r.task_id] for r in told if r.accepted})
                again += told
            st.steps["offer"] += clock() - t_offer
            refused = [r for r in again if not r.accepted]
            if refused:
                for rep in again:
                    if rep.accepted and rep.task_id in st.sent:
                        st.sent[rep.task_id] = final[rep.task_id]
                placed_here = set(placements) if only is None else set(only)
                await self._unplace_refused(
                    run, st, refused, todo, placements, placed_here, rnd, st.reasons
                )
                return False
        if only is not None:
            await self._tell_consumers(run, only, placements, st, order, rnd)
        bound = {
            tid: lifecycle.BoundTask(
                x.agent_id,
                x.device_id,
                st.tokens[tid],
                predicted_s=placements[tid].finish - placements[tid].start,
                base_s=att.planned.cost.base(tid, placements[tid].device_id),
            )
            for tid, x in final.items()
            # a producer only told where its consumers went: where and how it runs is as
            # before, and its state is its events' (it may have ended meanwhile)
            if only is None or tid in only
        }
        plan = att.planned.plan
        lifecycle.step(
            run,
            lifecycle.Bound(
                placements, planned_view(placements), plan.algorithm, bound, plan.cost or 0.0
            ),
            self.o.mono(),
        )
        return True

    async def _unplace_refused(
        self,
        run: PipelineRun,
        st: Round,
        refused: list[OfferReply],
        todo: dict[str, Placement],
        placements: dict[str, Placement],
        placed_here: set[str],
        rnd: int,
        reasons: dict[str, str],
    ) -> None:
        """Tasks of this placement (accepted in an earlier round, or offered again in this
        one) whose agent refused the offer that tells them their token or where their
        consumers went: it began draining, restarted, or stopped answering since. As for a
        rejection, that (task, device) is ruled out (device-wide for DEVICE_WIDE codes), and
        the task and what it feeds are placed again, their windows given back and their
        offers withdrawn; the rest of the round stays (sent again as it was, the same offer
        would be refused each round until the rounds ran out and the pipeline failed)."""
        o = self.o
        for rep in refused:
            run.rejections += 1
            dev = placements[rep.task_id].device_id
            st.excluded.add((rep.task_id, dev))
            if rep.code in DEVICE_WIDE:
                st.excluded.update((t.id, dev) for t in run.spec.tasks)
            msg = f"{rep.code}: {rep.reason}"
            reasons[f"{rep.task_id}@{dev}"] = msg
            run.note(
                f"round {rnd}: {rep.agent_id} refused {rep.task_id}'s updated offer ({msg}); "
                "re-planning elsewhere"
            )
        affected = descendants(run, {r.task_id for r in refused}) & placed_here - st.kept
        # each booked by this placement (this round, or fixed from an earlier one: a round
        # that gets here wrote every key it meant to), its window where `run.windows` says
        booked: dict[str, list[str]] = {}
        for t in sorted(affected):
            if t in run.windows:
                booked.setdefault(run.windows[t][0], []).append(t)
        now = o.wall()
        await asyncio.gather(
            *(o.store.release(k, run.pipeline_id, now, ts) for k, ts in sorted(booked.items()))
        )
        withdrawn = {t: placements[t] for t in affected if t in st.sent}
        if withdrawn:
            await o.cancel_tasks(
                run, withdrawn, "re-planned after an updated offer was refused",
                max_token=max(st.sent[t].token for t in withdrawn),
            )  # fmt: skip
        for t in affected:
            st.sent.pop(t, None)
            st.fixed.pop(t, None)
        for tid, p in todo.items():
            if tid not in affected:
                st.fixed[tid] = p

    async def _tell_consumers(
        self,
        run: PipelineRun,
        only: set[str],
        placements: dict[str, Placement],
        st: Round,
        order: dict[str, int],
        rnd: int,
    ) -> None:
        """Consumers that stay where they are, not started, of tasks placed again: offered
        again under their own token, naming their producers' new runs, before those runs
        are committed, so their agents take no output of a run this placement supersedes
        (one whose agent comes back and pushes it). One not told (its agent did not answer,
        or it started meanwhile) may still run on such an output: its end says so, and its
        result is refused and the task run again (`PipelineRun.void`)."""
        stay = sorted({
            c for t in only for c in run.children[t]
            if c not in only and c in placements
            and run.tasks[c].state in ("offered", "accepted") and run.tasks[c].token
        })  # fmt: skip
        if not stay:
            return
        offers = [self._offer(run, c, placements, st, order) for c in stay]
        replies = await self.o.offer_many(offers)
        missed = [f"{r.task_id} ({r.code})" for r in replies if not r.accepted]
        if missed:
            run.note(
                f"round {rnd}: not told of their producers' new runs: {', '.join(missed)}; "
                "a result on an old run's output is refused"
            )

    def _offer(
        self,
        run: PipelineRun,
        tid: str,
        placements: dict[str, Placement],
        st: Round,
        order: dict[str, int],
        *,
        provisional: bool = False,
    ) -> TaskOffer:
        spec_by_id = run.spec_by_id
        task = spec_by_id[tid]
        p = placements[tid]
        agent_id, dev_id = p.device_id.split(":", 1)
        consumers = []
        agents = self.o.view.agents
        for c in run.children[tid]:
            to = placements[c].device_id.split(":", 1)[0]
            # with the level its agent reads (this task's agent sends it only what that
            # reads) and its site (a large output to one at this task's site stays there)
            at = agents[to].advert.site if to in agents else None
            consumers.append(ConsumerRef(task_id=c, agent_id=to, wire=self.o.wire_of(to), site=at))
        return TaskOffer(
            pipeline_id=run.pipeline_id, agent_id=agent_id,
            incarnation=self.o.view.agents[agent_id].advert.incarnation, device_id=dev_id,
            slot=p.slot, token=0 if provisional else st.tokens[tid], order=order[tid], task=task,
            window_start=st.t0 + p.start, window_end=st.t0 + p.finish,
            priority=run.spec.priority,
            replaces=prev[1] if (prev := st.prior.get(tid)) and prev[2] == agent_id else 0,
            inputs=[InputRef(task_id=d, agent_id=(by := placements[d].device_id.split(":", 1)[0]),
                             wire=self.o.wire_of(by),
                             ready=run.tasks[d].state == "succeeded" or d in st.ended,
                             media_type=spec_by_id[d].output_type,
                             token=0 if provisional else st.tokens.get(d, 0))
                    for d in task.deps],
            consumers=consumers,
            pipeline_inputs=[
                i for i in run.spec.inputs
                if any(b.pipeline_input == i.name for b in task.inputs)
            ],
        )  # fmt: skip

    async def _withdraw(self, run: PipelineRun, asked: Asked) -> None:
        """Withdraw every offer a failed first placement sent, once each has been answered
        (or given up on): from each agent, every task offered there, under at most the
        highest token offered there (nothing of the pipeline there is any other's). Offers
        refused, or withdrawn already by a re-plan, are named too: an agent that holds no
        such job does nothing."""
        try:
            await asyncio.wait(asked.answers)
            for answers in asked.answers:  # what failed was said where it was awaited
                if not answers.cancelled():
                    answers.exception()
            per_agent: dict[str, list[str]] = {}
            for agent_id, tid in asked.tokens:
                per_agent.setdefault(agent_id, []).append(tid)
            for agent_id, tids in sorted(per_agent.items()):
                cmd = CancelCommand(
                    pipeline_id=run.pipeline_id, reason="placement failed",
                    task_ids=sorted(tids),
                    max_token=max(asked.tokens[(agent_id, t)] for t in tids),
                )  # fmt: skip
                with contextlib.suppress(Exception):
                    await self.o.tell_agent(subjects.cancel, agent_id, cmd)
        finally:
            if self._withdrawals.get(run.pipeline_id) is asyncio.current_task():
                del self._withdrawals[run.pipeline_id]  # (not a later placement's)

    async def withdrawn(self, pid: str) -> None:
        """The withdrawal of a failed placement's offers has been sent (or failed): a new
        placement of the id offered after it is not withdrawn with it."""
        pending = self._withdrawals.get(pid)
        if pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(pending)

    async def _release(
        self,
        run: PipelineRun,
        by_key: dict[str, list[BookingWindow]],
        tasks: set[str],
        skip: set[str],
    ) -> None:
        now = self.o.wall()
        jobs = []
        for key, ws in by_key.items():
            mine = [w.task_id for w in ws if w.task_id in tasks]
            if mine and key not in skip:
                jobs.append(self.o.store.release(key, run.pipeline_id, now, mine))
        await asyncio.gather(*jobs)


#: Shortest reservation: a task predicted to take microseconds still holds its slot a while
#: (plans give no task less: `planning.MIN_TASK_S`).
MIN_WINDOW_S = MIN_TASK_S


def window_ends(placements: dict[str, Placement], todo: Iterable[str]) -> dict[str, float]:
    """Reserved end of each task in `todo`: its planned finish, stretched to MIN_WINDOW_S
    but never into the next task the plan puts on the same slot (a pipeline's own windows
    must not overlap, or its booking would conflict with itself)."""
    starts: dict[tuple[str, int], list[tuple[float, str]]] = {}
    for p in placements.values():
        starts.setdefault((p.device_id, p.slot), []).append((p.start, p.task_id))
    for lst in starts.values():
        lst.sort()
    out: dict[str, float] = {}
    for tid in todo:
        p = placements[tid]
        lst = starts[(p.device_id, p.slot)]
        after = lst[bisect_left(lst, (p.finish, "")) :]
        nxt = next((s for s, other in after if other != tid), math.inf)
        out[tid] = max(p.finish, min(p.start + MIN_WINDOW_S, nxt))
    return out


def plan_order(placements: dict[str, Placement]) -> dict[str, int]:
    """Each task's rank by planned start (ties by id): agents start ready work in this order."""
    ranked = sorted(placements, key=lambda t: (placements[t].start, t))
    return {t: i for i, t in enumerate(ranked)}


def planned_view(placements: dict[str, Placement]) -> list[PlannedTask]:
    return [
        PlannedTask(
            task_id=p.task_id,
            agent_id=p.device_id.split(":", 1)[0],
            device_id=p.device_id.split(":", 1)[1],
            slot=p.slot,
            start_s=max(0.0, p.start),
            finish_s=max(0.0, p.finish),
        )
        for p in sorted(placements.values(), key=lambda p: (p.start, p.task_id))
    ]
