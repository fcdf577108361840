"""Failure detection and recovery: the asyncio shell around `orchestrator.reliability.health`.

Inputs: adverts and heartbeats (via the orchestrator), the server's connect/disconnect
advisories (`$SYS.ACCOUNT.<acc>.CONNECT|DISCONNECT`, when the account imports them: the
primary presence signal, a crash or a silent link closes the agent's connection), a timer
that wakes at the tracker's next deadline, and task events. On a death it releases the dead
agent's reservations and re-places, incrementally, every unfinished task it held plus each
finished task whose output is gone with it (or was already handed over to a consumer that now
must run again), keeping everything else fixed. The same path re-places a task its agent
cancelled on its own (drain deadline, shutdown). Succeeded results are committed exactly once
(`orchestrator.reliability.results`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import nats
from nats.aio.msg import Msg

from orchestrator.infra import eventloop
from orchestrator.reliability.health import (
    DEFAULT_FLOOD_FRACTION,
    DEFAULT_FLOOD_MIN,
    DEFAULT_PARTITION_TIMEOUT_S,
    Effect,
    HealthTracker,
    Partition,
    Recover,
    Transition,
)
from orchestrator.reliability.results import RETRY_FOR_S, Outcome, ResultLedger
from orchestrator.reservations import book as rules
from orchestrator.reservations.store import device_key_of
from orchestrator.state import lifecycle
from schemas import subjects
from schemas.advisories import STALE_CONNECTION, ConnectionAdvisory
from schemas.agent import AgentAdvert, Heartbeat
from schemas.api import TaskState
from schemas.bookings import DeviceBookings
from schemas.codec import DecodeError, RemoteError, decode, encode
from schemas.events import TaskEvent
from schemas.placement import CancelCommand, DataTransfer, FetchRequest
from schemas.recovery import ClusterEvent, ClusterEventKind

if TYPE_CHECKING:
    from orchestrator.ports import RecoveryDoor
    from orchestrator.state.pipelines import PipelineRun

log = logging.getLogger("mars.recovery")
AGENT_CLIENT_PREFIX = "mars-agent-"
#: How long the orchestrator waits for a producer's agent to say it still holds an output.
PROBE_TIMEOUT_S = 0.5
#: Longest advisory payload read (the server's are a few hundred bytes).
MAX_ADVISORY_BYTES = 64 * 1024
#: Task states that still have to (re)run when their agent is gone.
UNFINISHED = ("pending", "offered", "accepted", "started", "cancelled")
WAITING = ("pending", "offered", "accepted")
#: A re-placement that found no capacity is retried this often, and given up after this long
#: (the pipeline then fails with the reason).
STUCK_RETRY_S = 5.0
STUCK_TIMEOUT_S = 300.0
#: ... but an agent joining (new, or a new incarnation) is room: every waiting re-placement is
#: tried again this soon after the first join (a restarting fleet's adverts come within it).
JOIN_SETTLE_S = 0.2


#: What a re-placement re-places, and so how it is retried: the unfinished tasks of agents
#: gone ("gone"), every task its agent gave up ("cancelled"), tasks starved of inputs
#: ("starved"), finished producers whose outputs are lost ("lost").
StuckKind = Literal["gone", "cancelled", "starved", "lost"]


@dataclass
class Stuck:
    """A pipeline's re-placement that found no capacity, retried as the kind it is. One per
    pipeline and kind: a second of the same kind adds to it (the agents gone, the tasks), it
    does not replace it (two dead agents' tasks, both waiting for room)."""

    kind: StuckKind
    gone: set[str]
    why: str
    #: The dead incarnation of each agent in `gone` where known: one that comes back under it
    #: (a partition healed) still holds its tasks, and leaves `gone`.
    incarnations: dict[str, str]
    since: float
    tried: float
    #: A starved re-placement's tasks (`Recovery.rerun_starved`), or producers to run again
    #: (`Recovery.rerun_lost`): retried as such.
    starved: frozenset[str] | None = None
    lost: frozenset[str] | None = None


@dataclass(frozen=True)
class _Ask:
    """What one recovery was asked to do: its kind, the agents gone (with their dead
    incarnations where known), why, and the tasks of a starved or lost re-placement."""

    kind: StuckKind
    gone: set[str]
    why: str
    incarnations: dict[str, str]
    starved: frozenset[str] | None = None
    lost: frozenset[str] | None = None


#: After this orchestrator reconnects to NATS, how long agents have to come back before
#: missed heartbeats count again (agents reconnect with jittered backoff capped at 8 s).
OBSERVER_GRACE_S = 10.0


class LeaseLapsed(Exception):
    """A re-placement put off: this replica's lease on the pipeline lapsed (and is still its)."""


class Recovery:
    def __init__(
        self,
        orch: RecoveryDoor,
        *,
        flood_fraction: float = DEFAULT_FLOOD_FRACTION,
        flood_min: int = DEFAULT_FLOOD_MIN,
        partition_timeout_s: float = DEFAULT_PARTITION_TIMEOUT_S,
    ) -> None:
        self.o = orch
        self.health = HealthTracker(
            orch.view.misses,
            flood_fraction=flood_fraction,
            flood_min=flood_min,
            partition_timeout_s=partition_timeout_s,
        )
        self.ledger: ResultLedger | None = None
        self.stats: Counter[str] = Counter()
        #: (agent, incarnation) -> pipeline -> tasks moved away from it; cancelled there if
        #: that incarnation turns up again (a healed silent partition).
        self.moved: dict[tuple[str, str], dict[str, set[str]]] = {}
        self._wake = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
        self._commits: dict[str, set[asyncio.Future[Outcome]]] = {}
        #: agent -> (server, client id) of its newest connection, from CONNECT advisories.
        self._conns: dict[str, tuple[str, int]] = {}
        #: Pipelines whose re-placement found no capacity, retried every STUCK_RETRY_S.
        self._stuck: dict[tuple[str, StuckKind], Stuck] = {}
        self.stuck_timeout_s = STUCK_TIMEOUT_S
        #: agent -> incarnations superseded by a newer one (a zombie behind a healed partition
        #: must not take the agent id back).
        self.buried: dict[str, list[str]] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        o = self.o
        assert o.nc is not None
        self.ledger = ResultLedger(o.js, o.owner, keep_s=o.keep_s)
        await self.ledger.start()
        await o.nc.subscribe(subjects.CONN_ADVISORIES, cb=self._on_advisory)
        o.spawn(self._loop())

    async def _loop(self) -> None:
        """Tick the tracker at its next deadline (or when woken by a new member)."""
        while True:
            self._apply(self.health.tick(self.o.mono()))
            due = min(self.health.next_check(), self._retry_stuck(self.o.mono()))
            wait = min(max(due - self.o.mono(), 0.0) + 1e-3, 1.0)
            self._wake.clear()
            await eventloop.wait_event(self._wake, wait)

    def wake(self) -> None:
        """Look at what is due now rather than at the next deadline (a clock driven from
        outside, as in the door tests: a routine advert no longer wakes the loop)."""
        self._wake.set()

    # -- inputs ---------------------------------------------------------------------------------
    def on_advert(self, adv: AgentAdvert, now: float, joined: bool = False) -> None:
        """`joined`: the advert brought a new agent or incarnation into the view."""
        m = self.health.members.get(adv.agent_id)
        # a live member's advert only moves its deadline later: the timer need not know
        routine = (
            m is not None and m.incarnation == adv.incarnation and m.state == "alive"
            and m.interval_s <= adv.heartbeat_interval_s and not joined
        )  # fmt: skip
        self._apply(self.health.join(adv.agent_id, adv.incarnation, adv.heartbeat_interval_s, now))
        if joined:
            # room: what waits for some is tried again now, not at its next periodic retry
            # (else a restarted fleet's tasks wait up to STUCK_RETRY_S, or, with a server
            # outage in between, for the stall watchdog)
            soon = now - STUCK_RETRY_S + JOIN_SETTLE_S
            for st in self._stuck.values():
                st.tried = min(st.tried, soon)
        if not routine:
            self._wake.set()

    def is_buried(self, agent_id: str, incarnation: str) -> bool:
        return incarnation in self.buried.get(agent_id, ())

    def observer_lost(self) -> None:
        """This orchestrator's own NATS connection dropped: no liveness verdicts meanwhile."""
        self.health.observer_lost()
        log.warning("lost NATS: agent liveness verdicts paused")

    def observer_back(self) -> None:
        """Reconnected: agents get OBSERVER_GRACE_S to reconnect on their own backoff."""
        self.health.observer_back(self.o.mono(), OBSERVER_GRACE_S)
        self._wake.set()
        log.warning("NATS is back: agents judged again after %.0f s", OBSERVER_GRACE_S)

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self._apply(self.health.beat(hb.agent_id, hb.incarnation, now))

    async def _on_advisory(self, msg: Msg) -> None:
        tokens = msg.subject.split(".")
        if len(tokens) != 4 or tokens[3] not in ("CONNECT", "DISCONNECT"):
            return
        if len(msg.data) > MAX_ADVISORY_BYTES:
            return
        try:
            adv = decode(msg.data, ConnectionAdvisory, "json")
        except DecodeError:
            return
        name, conn = adv.client.name, (adv.server.id, adv.client.id)
        if not name.startswith(AGENT_CLIENT_PREFIX):
            return
        agent_id = name[len(AGENT_CLIENT_PREFIX) :]
        entry = self.o.view.agents.get(agent_id)
        nkey = entry.advert.nkey if entry is not None else None
        if nkey is not None and adv.client.user != nkey:
            # a connection named as an agent the server did not authenticate as it (any
            # client may pick its name): its comings and goings say nothing of that agent
            self.stats["misnamed_advisories"] += 1
            return
        if tokens[3] == "CONNECT":
            self._conns[agent_id] = conn
            return
        if self._conns.get(agent_id, conn) != conn:
            return  # an older connection closing after its reconnect: the agent is fine
        self._conns.pop(agent_id, None)
        self.stats["disconnect_advisories"] += 1
        # the server closed it for unanswered pings: a silent link or a hung agent
        cause = "silent" if adv.reason == STALE_CONNECTION else "disconnect"
        if cause == "silent":
            self.stats["silent_disconnects"] += 1
        self._apply(self.health.disconnected(agent_id, None, self.o.mono(), cause))

    def commit_result(self, run: PipelineRun, ev: TaskEvent) -> None:
        """A success applied: record it as the task's result, exactly once (gathered now,
        written by the ledger's next flush or by `settle`)."""
        if self.ledger is None:
            return
        asked = self.ledger.ask(ev, run.index[ev.task_id])
        asked.add_done_callback(lambda f: self._committed(run, ev, f.result()))
        pending = self._commits.setdefault(run.pipeline_id, set())
        pending.add(asked)
        asked.add_done_callback(pending.discard)

    def run_again(self, run: PipelineRun, task_id: str, why: str) -> None:
        """A task its agent gave up, or whose result was refused: placed again, with whatever
        must run again to feed it."""
        self.o.spawn(self.recover_run(run, {task_id}, set(), why))

    async def settle(self, pipeline_id: str) -> None:
        """Write this pipeline's gathered result commits now and wait until all are done."""
        pending = self._commits.pop(pipeline_id, set())
        if self.ledger is not None:
            await self.ledger.flush(pipeline_id)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self.ledger is not None:
            self.ledger.forget(pipeline_id)

    def _committed(self, run: PipelineRun, ev: TaskEvent, outcome: Outcome) -> None:
        if outcome == "committed":
            run.results_committed += 1
        elif outcome == "error":  # tried again for results.RETRY_FOR_S first
            self.stats["results_error"] += 1
            log.error(
                "result of %s/%s not committed: its writes kept failing for %.0f s",
                ev.pipeline_id, ev.task_id, RETRY_FOR_S,
            )  # fmt: skip
        else:
            run.results_dropped += 1
            self.stats[f"results_{outcome}"] += 1
            log.info("result of %s/%s not committed: %s", ev.pipeline_id, ev.task_id, outcome)

    # -- effects --------------------------------------------------------------------------------
    def _apply(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Transition):
                self._on_transition(e)
            elif isinstance(e, Recover):
                self.o.spawn(self.recover_agent(e))
            else:
                self._on_partition(e)

    def _on_transition(self, e: Transition) -> None:
        kinds: dict[str, ClusterEventKind] = {
            "suspect": "agent_suspect",
            "alive": "agent_alive",
            "dead": "agent_dead",
        }
        # suspicion that clears by itself is routine; deaths and returns from death are not
        level = {"dead": logging.WARNING, "suspect": logging.DEBUG}.get(e.new, logging.INFO)
        if e.new == "alive" and e.old == "suspect":
            level = logging.DEBUG
        log.log(level, "agent %s: %s -> %s (%s)", e.agent_id, e.old, e.new, e.cause)
        self.stats[f"to_{e.new}"] += 1
        if e.new == "dead" and e.cause == "new_incarnation":
            gone = self.buried.setdefault(e.agent_id, [])
            gone.append(e.incarnation)
            del gone[:-8]
        if e.new == "dead":
            self.o.view.mark_dead(e.agent_id, e.incarnation)  # out of planning now
        elif e.new == "alive" and e.cause == "rejoined":
            self.o.spawn(self._withdraw_moved(e.agent_id, e.incarnation))
        self.o.cluster_changed.set()
        self._publish(ClusterEvent(kind=kinds[e.new], agents=[e.agent_id], cause=e.cause))

    def _on_partition(self, e: Partition) -> None:
        n, fleet = len(e.agents), len(self.health.members)
        if e.started:
            self.stats["partitions"] += 1
            why = (
                f"{n} of {fleet} agents lost at once ({', '.join(e.agents[:20])}): "
                "suspected partition, re-placement paused"
            )
            log.warning(why)
        else:
            why = f"partition over ({e.cause}); recovering {n} agents still dead"
            log.warning(why)
        for run in self.o.pipelines.values():
            if not run.terminal and any(tr.agent_id in e.agents for tr in run.tasks.values()):
                run.note(why)
        kind: ClusterEventKind = "partition_suspected" if e.started else "partition_ended"
        self._publish(ClusterEvent(kind=kind, agents=list(e.agents), cause=e.cause, reason=why))

    def _publish(self, ev: ClusterEvent) -> None:
        nc = self.o.nc
        if nc is None or not nc.is_connected:
            return
        ev = ev.model_copy(update={"orchestrator": self.o.owner[:256]})
        self.o.spawn(self._send(subjects.CLUSTER_EVENTS, encode(ev)))

    async def _send(self, subject: str, data: bytes) -> None:
        nc = self.o.nc
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.publish(subject, data)

    # -- recovery -------------------------------------------------------------------------------
    async def recover_agent(self, rec: Recover) -> None:
        """A dead agent: give its reservations back, re-place what it held."""
        self.stats["recoveries"] += 1
        lost = lifecycle.AgentLost(rec.agent_id, rec.incarnation, rec.cause)
        now = self.o.mono()
        asks = [
            (r, e)
            for r in list(self.o.pipelines.values())
            for e in lifecycle.step(r, lost, now)
            if isinstance(e, lifecycle.RePlace)
        ]
        self.o.spawn(self._release_agent(rec.agent_id, [r for r, _ in asks]))
        await asyncio.gather(
            *(self.recover_run(r, None, set(e.gone), e.why, e.incarnations) for r, e in asks)
        )

    async def _release_agent(self, agent_id: str, runs: list[PipelineRun]) -> None:
        """Drop this replica's windows on the dead agent's devices (others' expire or are
        dropped by their owners' recovery)."""
        keys = {
            device_key_of(p.device_id)
            for r in runs
            for p in r.placements.values()
            if p.device_id.split(":", 1)[0] == agent_id
        }
        owner, now = self.o.owner, self.o.wall()

        def drop(b: DeviceBookings) -> rules.AddResult:
            kept = [w for w in rules.live(b.windows, now) if w.owner != owner]
            return rules.AddResult(True, DeviceBookings(device=b.device, windows=kept))

        for key in sorted(keys):
            try:
                await self.o.store.transact(key, drop)
            except Exception as exc:
                log.warning("releasing %s failed (the windows will expire): %s", key, exc)

    def lock(self, pipeline_id: str) -> asyncio.Lock:
        """Held while a pipeline's tasks are re-placed (recovery, re-runs, evictions), so one
        re-placement plans on what the one before it made, never beside it."""
        lock = self._locks.get(pipeline_id)
        if lock is None:
            lock = self._locks[pipeline_id] = asyncio.Lock()
        return lock

    async def recover_run(
        self,
        run: PipelineRun,
        seeds: set[str] | None,
        gone: set[str],
        why: str,
        incarnations: Mapping[str, str] | None = None,
        starved: set[str] | None = None,
        lost: set[str] | None = None,
        still: Callable[[], bool] | None = None,
    ) -> None:
        """Re-place `seeds` (default: the unfinished tasks on the `gone` agents; `starved`:
        exactly those tasks; `lost`: those finished producers, to run again while their
        consumers stay where they are) and whatever must run again to feed them, everything
        else fixed.
        When nothing can take them, the tasks stay where they were (an agent that comes back,
        or a new incarnation replaying its journal, may still finish them) and the attempt is
        repeated now and then."""
        ask = _Ask(
            kind="starved" if starved is not None
            else "lost" if lost is not None
            else "gone" if seeds is None
            else "cancelled",
            gone=gone, why=why, incarnations=dict(incarnations or {}),
            starved=frozenset(starved) if starved is not None else None,
            lost=frozenset(lost) if lost is not None else None,
        )  # fmt: skip
        async with self.lock(run.pipeline_id):
            if not self._may_recover(run, ask, seeds, still):
                return
            seeds = self._seeds(run, ask, seeds)
            redo, waiting = await self._redo(run, ask, seeds)
            if not redo:
                self._done_waiting(run.pipeline_id, ask.kind, gone, starved, lost)
                return
            if not await self._re_place(run, ask, seeds, redo, waiting):
                return
        await self.o.persist(run)
        await self.o.notify_changed()

    def _may_recover(
        self, run: PipelineRun, ask: _Ask, seeds: set[str] | None, still: Callable[[], bool] | None
    ) -> bool:
        """Whether this replica acts on the pipeline now. Its lease lapsed here and still
        ours (cut off from JetStream, e.g. the server away): it is renewed once the server is
        back, so this waits and is retried like a re-placement that found no room (dropped,
        nothing would ask again: a fleet restarted during a server outage would leave its
        tasks lost until the stall watchdog)."""
        pid = run.pipeline_id
        if not run.terminal and self.o.failover.holds(pid) and not self.o.failover.may_act(pid):
            named = seeds if seeds is not None else ask.starved or ask.lost or {
                t for t, tr in run.tasks.items()
                if tr.agent_id in ask.gone and tr.state in UNFINISHED
            }  # fmt: skip
            self._wait_for_capacity(
                run, set(named), ask.kind, ask.gone, ask.why, ask.incarnations,
                LeaseLapsed("this replica's lease on it lapsed; retried once renewed"),
                ask.starved, ask.lost,
            )  # fmt: skip
            return False
        if run.terminal or not self.o.failover.may_act(pid):
            for k in [k for k in self._stuck if k[0] == pid]:
                del self._stuck[k]
            return False  # finished, or another replica owns it now
        # what asked for it may be out of date (a re-placement came first)
        return still is None or still()

    @staticmethod
    def _seeds(run: PipelineRun, ask: _Ask, seeds: set[str] | None) -> set[str]:
        """The tasks this recovery is about, as they stand now."""
        if ask.starved is not None:
            return {t for t in ask.starved if run.tasks[t].state in ("offered", "accepted")}
        if ask.lost is not None:
            return {t for t in ask.lost if run.tasks[t].state == "succeeded"}
        if seeds is None:
            return {
                t for t, tr in run.tasks.items()
                if tr.agent_id in ask.gone and tr.state in UNFINISHED
            }  # fmt: skip
        # every task its agent gave up so far, in one re-plan
        return {t for t, tr in run.tasks.items() if tr.state == "cancelled"}

    async def _redo(
        self, run: PipelineRun, ask: _Ask, seeds: set[str]
    ) -> tuple[set[str], set[str]]:
        """What runs again (the seeds and whatever must run again to feed them), and of it
        the consumers that only wait (booked again after the re-runs, where they are)."""
        if ask.lost is None:
            return await self._closure(run, seeds, ask.gone), set()
        # their waiting consumers are in it too, so every producer of theirs that no longer
        # holds its output runs again in this one re-placement (not one per report); they
        # stay on their devices, only later: booked again after the re-runs (their old
        # windows, before them, would refuse those)
        redo = await self._closure(run, seeds | self._waiting(run, seeds), ask.gone)
        waiting = {t for t in redo if run.tasks[t].state in ("offered", "accepted")}
        waiting |= self._waiting(run, redo)
        return redo | waiting, waiting

    async def _re_place(
        self, run: PipelineRun, ask: _Ask, seeds: set[str], redo: set[str], waiting: set[str]
    ) -> bool:
        """Detach `redo` from its placements and place it anew; put back as it was when that
        fails. False when the pipeline ended meanwhile (nothing more to record here)."""
        exclude = self.o.view.only_on({c: run.placements[c].device_id for c in waiting})
        saved = {t: (run.tasks[t].state, run.tasks[t].agent_id, run.tasks[t].token) for t in redo}
        was = {t: run.placements[t] for t in redo if t in run.placements}
        booked = {t: run.windows[t] for t in redo if t in run.windows}
        lifecycle.step(run, lifecycle.Detached(frozenset(redo)), self.o.mono())
        try:
            await self.o.placer.place(run, only=redo, exclude=exclude)
        except Exception as exc:  # PlacementFailed, or nothing left to plan on at all
            return await self._put_back(run, ask, redo, saved, exc)
        except BaseException:  # cancelled (the replica stopping): nothing kept
            lifecycle.step(run, lifecycle.Replaced(frozenset(redo)), self.o.mono())
            raise
        # placed anew: their old placements' events are stale
        lifecycle.step(run, lifecycle.Replaced(frozenset(redo)), self.o.mono())
        self._done_waiting(run.pipeline_id, ask.kind, ask.gone, ask.starved, ask.lost)
        for agent in ask.gone:
            incarnation = ask.incarnations.get(agent)
            if incarnation is not None:
                moved = self.moved.setdefault((agent, incarnation), {})
                moved.setdefault(run.pipeline_id, set()).update(
                    t for t, (_, a, _) in saved.items() if a == agent
                )
        if ask.starved is not None:  # their agents are alive: withdraw what moved away
            now = self.o.wall()
            for t, p in was.items():
                holder, token = saved[t][1], saved[t][2]
                if holder and holder != run.tasks[t].agent_id:
                    await self.o.cancel_tasks(run, {t: p}, ask.why, max_token=token)
                old = booked.get(t)
                if old is not None and old[0] != run.windows.get(t, old)[0]:
                    # and give back the window it leaves (else it holds that device until
                    # it expires: nothing renews or releases it there any more)
                    key, start, end = old
                    self.o.store.defer_release(key, run.pipeline_id, now, exact=[(t, start, end)])
        await self.o.commits.commit_all(run, redo)
        # a producer still running was told where these consumers were: tell it where
        # they are now, or it sends to the dead agent and they wait for a fetch
        await self.o.displaced.reroute_producers(
            run, {t: run.placements[t] for t in redo if t in run.placements}
        )
        run.recoveries += 1
        self.stats["tasks_replaced"] += len(redo)
        self._note(run, ask, seeds, redo, waiting)
        return True

    async def _put_back(
        self,
        run: PipelineRun,
        ask: _Ask,
        redo: set[str],
        saved: Mapping[str, tuple[TaskState, str | None, int]],
        exc: Exception,
    ) -> bool:
        """A re-placement that failed: its tasks as they were, waiting for room to try again.
        False when the pipeline ended meanwhile."""
        put_back = lifecycle.PutBack(dict(saved), ask.why)
        await self.o.carry_out(run, lifecycle.step(run, put_back, self.o.mono()))
        if run.terminal:  # it ended meanwhile (the placer gave back what it booked)
            self._done_waiting(run.pipeline_id, ask.kind, ask.gone, ask.starved, ask.lost)
            return False
        self._wait_for_capacity(
            run, redo, ask.kind, ask.gone, ask.why, ask.incarnations, exc, ask.starved, ask.lost
        )
        return True

    @staticmethod
    def _note(
        run: PipelineRun, ask: _Ask, seeds: set[str], redo: set[str], waiting: set[str]
    ) -> None:
        """Say on the pipeline what this recovery did."""
        if ask.lost is not None:
            run.note(
                f"{ask.why}: re-running {', '.join(sorted(redo - waiting))} (outputs lost)"
                + (f"; {', '.join(sorted(waiting))} booked again after" if waiting else "")
            )
        else:
            reruns = sorted(t for t in redo if t not in seeds)
            did = [f"re-placed {', '.join(sorted(seeds))}"] if seeds else []
            if reruns:  # (none of its own tasks left: only outputs it held)
                did.append(f"re-running {', '.join(reruns)} (outputs lost)")
            run.note(f"{ask.why}: {'; '.join(did)}")
        log.info("%s: %s re-placed %s", run.pipeline_id, ask.why, sorted(redo))

    async def rerun_starved(self, run: PipelineRun, tasks: set[str]) -> None:
        """Tasks free to start that did not start even after being asked again: an input they
        wait for may be gone for good (its producer let it go after a delivery the consumer
        then lost, e.g. around a move). Re-place them, and re-run every producer that no
        longer holds their input."""
        why = f"starved of inputs: {', '.join(sorted(tasks))}"
        await self.recover_run(run, None, set(), why, starved=tasks)

    async def rerun_lost(
        self,
        run: PipelineRun,
        producers: set[str],
        why: str,
        still: Callable[[], bool] | None = None,
    ) -> None:
        """Finished producers whose outputs a consumer still waits for are held by nobody
        (their agents let them go after another placement of the consumer took them): run
        them again, and whatever must feed them, while the consumer stays where it is, so
        what they make goes where it waits (moving it too could send the next output to the
        place it just left, again)."""
        await self.recover_run(run, None, set(), why, lost=producers, still=still)

    def _wait_for_capacity(
        self,
        run: PipelineRun,
        redo: set[str],
        kind: StuckKind,
        gone: set[str],
        why: str,
        incarnations: dict[str, str],
        exc: Exception,
        starved: frozenset[str] | None = None,
        lost: frozenset[str] | None = None,
    ) -> None:
        now = self.o.mono()
        key = (run.pipeline_id, kind)
        first = self._stuck.get(key)
        if first is not None:  # what waited already waits on, with this
            gone = first.gone | gone
            incarnations = {**first.incarnations, **incarnations}
            if first.starved is not None and starved is not None:
                starved = first.starved | starved
            if first.lost is not None and lost is not None:
                lost = first.lost | lost
            if first.why != why and why not in first.why:
                why = f"{first.why}; {why}"[:2048]
        since = first.since if first is not None else now
        self._stuck[key] = Stuck(kind, gone, why, incarnations, since, now, starved, lost)
        if first is None:
            run.note(
                f"{why}: cannot re-place {', '.join(sorted(redo))} now "
                f"({type(exc).__name__}: {str(exc)[:500]}); they stay put and are retried"
            )
            log.warning("%s: %s; cannot re-place %s: %s", run.pipeline_id, why, sorted(redo), exc)
            self.o.spawn(self.o.notify_changed())  # its log says so now
        self._wake.set()

    def put_off(self, pipeline_id: str) -> bool:
        """Whether a re-placement of the pipeline waits to be retried (no room for it, or
        this replica may not act on it now)."""
        return any(k[0] == pipeline_id for k in self._stuck)

    def _done_waiting(
        self,
        pid: str,
        kind: StuckKind,
        gone: set[str],
        starved: Set[str] | None,
        lost: Set[str] | None,
    ) -> None:
        """A re-placement of `kind` is done (placed, or nothing left to place): what it
        covered no longer waits. Only that: another dead agent's tasks, or other starved
        tasks, gathered into the same wait, still do."""
        key = (pid, kind)
        st = self._stuck.get(key)
        if st is None:
            return
        if kind == "gone":
            st.gone -= gone
            for agent in gone:
                st.incarnations.pop(agent, None)
            left = bool(st.gone)
        elif kind == "starved" and st.starved is not None and starved is not None:
            st.starved = st.starved - starved
            left = bool(st.starved)
        elif kind == "lost" and st.lost is not None and lost is not None:
            st.lost = st.lost - lost
            left = bool(st.lost)
        else:
            left = False
        if not left:
            del self._stuck[key]

    def _still_gone(self, st: Stuck) -> bool:
        """Whether the re-placement still has something to do: an agent gone that came back
        under the incarnation that died (a partition healed) holds its tasks again, and
        leaves `gone`; a "gone" re-placement with none left is over."""
        for agent, inc in list(st.incarnations.items()):
            m = self.health.members.get(agent)
            if m is not None and m.incarnation == inc and m.state != "dead":
                st.gone.discard(agent)
                del st.incarnations[agent]
        return st.kind != "gone" or bool(st.gone)

    def _retry_stuck(self, now: float) -> float:
        """Retry re-placements that found no capacity; returns when the next one is due."""
        due = math.inf
        for key, st in list(self._stuck.items()):
            run = self.o.pipelines.get(key[0])
            if run is None or run.terminal or not self._still_gone(st):
                del self._stuck[key]
                continue
            if now - st.since > self.stuck_timeout_s and self.o.failover.may_act(key[0]):
                del self._stuck[key]
                why = f"{st.why}; no agent could take its tasks for {self.stuck_timeout_s:.0f} s"
                self.o.spawn(self._fail(run, why))
                continue
            at = st.tried + STUCK_RETRY_S
            if now >= at:
                st.tried = now
                # as the kind it is (a dead agent's retried as "every task its agent gave up"
                # found none and re-placed nothing: the pipeline never ended)
                if st.starved is not None:  # its tasks are not cancelled: name them again
                    self.o.spawn(self.rerun_starved(run, set(st.starved)))
                elif st.lost is not None:
                    self.o.spawn(self.rerun_lost(run, set(st.lost), st.why))
                elif st.kind == "cancelled":
                    self.o.spawn(self.recover_run(run, set(), set(st.gone), st.why))
                else:
                    self.o.spawn(
                        self.recover_run(run, None, set(st.gone), st.why, dict(st.incarnations))
                    )
                at = now + STUCK_RETRY_S
            due = min(due, at)
        return due

    async def _fail(self, run: PipelineRun, reason: str) -> None:
        await self.o.carry_out(run, lifecycle.step(run, lifecycle.GaveUp(reason), self.o.mono()))

    def _gone(self, agent_id: str | None, gone: set[str]) -> bool:
        return agent_id is None or agent_id in gone or self.health.is_dead(agent_id)

    @staticmethod
    def _waiting(run: PipelineRun, producers: set[str]) -> set[str]:
        """Placed consumers of `producers`, outside them, that have not started."""
        return {
            c for t in producers for c in run.children[t]
            if c not in producers and run.tasks[c].state in ("offered", "accepted")
            and c in run.placements
        }  # fmt: skip

    async def _closure(self, run: PipelineRun, seeds: set[str], gone: set[str]) -> set[str]:
        """`seeds` plus every finished task whose output a task that still has to run needs
        and can no longer get: its agent is gone, or its agent no longer holds the output
        (it was handed over, and acknowledged, to a consumer that must now run again)."""
        redo = set(seeds)
        probed: dict[tuple[str, str], bool] = {}
        while True:
            grew = False
            asks: list[tuple[str, str]] = []
            for t, tr in run.tasks.items():
                if t in redo or tr.state != "succeeded":
                    continue
                needy = [c for c in run.children[t] if c in redo or run.tasks[c].state in WAITING]
                if not needy:
                    continue
                if self._gone(tr.agent_id, gone):
                    redo.add(t)
                    grew = True
                    continue
                asks += [(t, c) for c in needy if c in redo and (t, c) not in probed]
            if asks:
                held = await asyncio.gather(*(self._retained(run, p, c) for p, c in asks))
                for (p, c), ok in zip(asks, held, strict=True):
                    probed[(p, c)] = ok
                    if not ok and p not in redo:
                        redo.add(p)
                        grew = True
            if not grew:
                return redo

    async def _retained(self, run: PipelineRun, producer: str, consumer: str) -> bool:
        """Ask the producer's agent whether it still holds the output for `consumer` (it then
        keeps it until the consumer's new placement fetches it)."""
        nc, tr = self.o.nc, run.tasks[producer]
        if nc is None or tr.agent_id is None:
            return False
        req = FetchRequest(
            pipeline_id=run.pipeline_id,
            producer=producer,
            consumer=consumer,
            agent_id=run.tasks[consumer].agent_id or tr.agent_id,
            token=tr.token,
        )
        try:
            await self.o.ask_agent(
                subjects.fetch, tr.agent_id, req, DataTransfer, timeout=PROBE_TIMEOUT_S
            )
            return True
        except (TimeoutError, RemoteError, nats.errors.Error) as exc:
            log.info("%s/%s not held by %s: %s", run.pipeline_id, producer, tr.agent_id, exc)
            return False

    async def _withdraw_moved(self, agent_id: str, incarnation: str) -> None:
        """A dead-declared agent came back as the same incarnation: stop the work that was
        moved away from it (its results would be stale anyway)."""
        moved = self.moved.pop((agent_id, incarnation), {})
        nc = self.o.nc
        for pid, tids in sorted(moved.items()):
            run = self.o.pipelines.get(pid)
            stale = sorted(t for t in tids if run is None or run.tasks[t].agent_id != agent_id)
            if stale and nc is not None:
                cmd = CancelCommand(
                    pipeline_id=pid, reason="re-placed while this agent was unreachable",
                    task_ids=stale,
                )  # fmt: skip
                with contextlib.suppress(Exception):
                    await self.o.tell_agent(subjects.cancel, agent_id, cmd)
