"""The API's questions about pipelines and agents (`status`, `list`, `cancel`, `agents`).

Each replica holds its own pipelines in memory: it answers for what it holds, passes a
request about another's pipeline on to the holder of its lease (never on again: no request
goes round in circles), and reads the record in KV of a pipeline nobody holds now. `list`
reads every pipeline's record in KV (`listing.py`) and asks every replica heard from lately
for what it holds, newer than its records. The service shell (orchestrator/service.py)
registers these as endpoints."""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, TypeVar

import nats
from nats.aio.msg import Msg

from orchestrator.api.listing import recorded
from orchestrator.reservations.store import Cached, device_key
from orchestrator.state import lifecycle
from schemas import subjects
from schemas.agent import DeviceSpec
from schemas.api import (
    TERMINAL_STATES,
    AgentsReply,
    AgentsRequest,
    AgentSummary,
    CancelReply,
    CancelRequest,
    DeviceQueue,
    ListReply,
    ListRequest,
    PipelineSummary,
    StatusReply,
    StatusRequest,
)
from schemas.base import WireModel
from schemas.codec import RemoteError
from schemas.errors import ServiceError
from schemas.failover import RUNS_BUCKET
from transport.rpc import request, respond

if TYPE_CHECKING:
    from orchestrator.ports import QueriesDoor
    from orchestrator.state.pipelines import PipelineRun

log = logging.getLogger("mars.orchestrator")

#: A request passed on to the replica holding the pipeline: how long its answer is awaited;
#: and how often a cancel made under a lapsed lease, then lost, is offered to the adopter.
PASS_S = 5.0
CANCEL_PASS_TRIES = 8
#: How long a `list` waits for each other replica's part.
LIST_WAIT_S = 1.0
M = TypeVar("M", bound=WireModel)


class Queries:
    """One replica's answers to `status`, `list`, `cancel` and `agents`."""

    def __init__(self, o: QueriesDoor) -> None:
        self.o = o
        #: How long a `list` waits for each other replica's part.
        self.list_wait_s = LIST_WAIT_S

    async def subscribe(self) -> None:
        """The subjects other replicas pass requests on by (each replica's own)."""
        nc, owner = self.o.nc, self.o.owner
        assert nc is not None
        await nc.subscribe(subjects.replica_cancel(owner), cb=self.on_passed_cancel)
        await nc.subscribe(subjects.replica_status(owner), cb=self.on_passed_status)
        await nc.subscribe(subjects.replica_list(owner), cb=self.on_list_here)

    def _acting_on(self, pid: str) -> PipelineRun | None:
        """The run of a pipeline this replica answers for itself: ended here, or held under
        a lease not lapsed."""
        run = self.o.pipelines.get(pid)
        return run if run is not None and (run.terminal or self.o.failover.may_act(pid)) else None

    def _held_here(self, pid: str) -> PipelineRun:
        """For a request passed on by another replica: served only while held here (never
        passed on again, so a request cannot go round in circles)."""
        run = self._acting_on(pid)
        if run is None:
            raise ServiceError(
                "unavailable", f"{self.o.owner} does not hold pipeline {pid}; ask again"
            )
        return run

    async def status(self, req: StatusRequest) -> StatusReply:
        pid = req.pipeline_id
        if (acting := self._acting_on(pid)) is not None:
            return acting.status(self.o.mono())
        run = self.o.pipelines.get(pid)  # its lease lapsed here: this copy stands still
        try:
            # its last persisted record, or the newer one of a replica that adopted it
            st = await self.o.failover.status_elsewhere(pid)
            if st is not None and (run is None or st.owner != self.o.owner):
                return st
            holder = await self.o.failover.holder(pid)
        except Exception:
            if run is None:
                raise
            return run.status(self.o.mono())  # JetStream not answering: what is known here
        if holder is not None and holder != self.o.owner:
            # no record yet (just placed: its owner writes the first one after replying; or
            # waiting for an agent): the holder answers from memory
            return await self._pass(holder, subjects.replica_status(holder), req, StatusReply)
        if run is not None:
            return run.status(self.o.mono())
        if holder is not None:
            raise ServiceError("unavailable", f"pipeline {pid} is being placed here; ask again")
        if await self.o.failover.lapsed_elsewhere(pid):
            raise ServiceError(
                "unavailable", f"pipeline {pid} is held by no replica now; ask again"
            )
        raise ServiceError("not_found", f"no pipeline {pid}")

    async def _status_held(self, req: StatusRequest) -> StatusReply:
        return self._held_here(req.pipeline_id).status(self.o.mono())

    async def on_passed_status(self, msg: Msg) -> None:
        await respond(self.o.nc, msg, StatusRequest, self._status_held)

    async def list(self, req: ListRequest) -> ListReply:
        """A page of every pipeline with a record in KV (`listing.py`: any replica's, up or
        not), each as the replicas up hold it in memory where one does (their memory is
        newer than their last record write, and holds pipelines not recorded yet: each
        replica heard from lately is asked for its own, `replicas.py`), then filtered and
        sorted newest first."""
        peers = self.o.replicas.up()
        # each one's own (one user's: `users.py`), merged before any other filter
        everything = ListRequest(limit=1000, user=req.user)
        asked = asyncio.gather(*(self._ask_list(p, everything) for p in peers))
        stored, answers = await asyncio.gather(self._recorded(req.user), asked)
        unanswered: list[str] = []
        if stored is None:
            unanswered.append(RUNS_BUCKET)
        merged = {s.pipeline_id: s for s in stored or ()}
        held = [self._list_here(everything), *answers]
        for peer, got in zip(["", *peers], held, strict=True):
            if got is None:
                unanswered.append(peer)
                continue
            for s in got.pipelines:  # a copy left where a lease lapsed says less than the end
                cur = merged.get(s.pipeline_id)
                if cur is None or cur.state not in TERMINAL_STATES or s.state in TERMINAL_STATES:
                    merged[s.pipeline_id] = s
        rows = [s for s in merged.values() if req.state is None or s.state == req.state]
        rows.sort(key=lambda s: (-(s.submitted or 0.0), s.pipeline_id))
        return ListReply(
            pipelines=rows[req.offset : req.offset + req.limit],
            unanswered=unanswered[:64],
            total=len(rows),
        )

    async def _recorded(self, user: str | None) -> builtins.list[PipelineSummary] | None:
        """Every pipeline's summary as its record says (`user`'s alone, when given); None
        when the records cannot be read (JetStream not answering), said in the reply's
        `unanswered`."""
        try:
            return await recorded(self.o.js, user=user)
        except Exception as exc:
            log.warning("list: the pipelines' records could not be read: %r", exc)
            return None

    def _list_here(self, req: ListRequest) -> ListReply:
        runs = [
            r for r in self.o.pipelines.values()
            if (req.state is None or r.state == req.state)
            and (req.user is None or r.spec.user == req.user)
        ]  # fmt: skip
        runs.sort(key=lambda r: -r.submitted_at)
        now, wall = self.o.mono(), self.o.wall()
        return ListReply(
            pipelines=[
                r.summary(submitted=max(0.0, wall - (now - r.submitted_at)))
                for r in runs[: req.limit]
            ]
        )

    async def on_list_here(self, msg: Msg) -> None:
        async def here(req: ListRequest) -> ListReply:
            return self._list_here(req)

        await respond(self.o.nc, msg, ListRequest, here)

    async def _ask_list(self, peer: str, req: ListRequest) -> ListReply | None:
        assert self.o.nc is not None
        try:
            return await request(
                self.o.nc, subjects.replica_list(peer), req, ListReply, timeout=self.list_wait_s
            )
        except Exception as exc:  # said in the reply's `unanswered`
            log.info("replica %s did not answer a list: %r", peer, exc)
            return None

    async def cancel(self, req: CancelRequest) -> CancelReply:
        """Any replica may be given a cancel (the API is a queue group): the one holding the
        pipeline's lease cancels it, so a cancel given to another is passed on to it."""
        pid = req.pipeline_id
        if (acting := self._acting_on(pid)) is not None:
            return await self.cancel_run(acting, req.reason)
        run = self.o.pipelines.get(pid)
        try:
            holder = await self.o.failover.holder(pid)
        except Exception:
            if run is None:
                raise
            holder = None  # JetStream not answering: cancelled here, as below
        if holder is not None and holder != self.o.owner:
            return await self._pass_cancel(holder, req)
        if run is not None:
            # its lease lapsed here and nobody else holds it: cancelled here, the end written
            # once the lease is renewed, or passed on to whoever adopts it (`cancel_lost`)
            return await self.cancel_run(run, req.reason)
        if holder is not None:  # ours, and no run yet: being placed or adopted here
            raise ServiceError("unavailable", f"pipeline {pid} is being placed; ask again")
        st = await self.o.failover.status_elsewhere(pid)
        if st is None and not await self.o.failover.lapsed_elsewhere(pid):
            raise ServiceError("not_found", f"no pipeline {pid}")
        if st is not None and st.state in TERMINAL_STATES:
            return CancelReply(pipeline_id=pid, state=st.state)
        raise ServiceError(
            "unavailable",
            f"pipeline {pid} is held by no replica now (its owner's lease lapsed, another "
            "adopts it); ask again",
        )

    async def _cancel_held(self, req: CancelRequest) -> CancelReply:
        return await self.cancel_run(self._held_here(req.pipeline_id), req.reason)

    async def on_passed_cancel(self, msg: Msg) -> None:
        # in a task of its own: a cancel writes the record, and the next one need not wait
        self.o.spawn(respond(self.o.nc, msg, CancelRequest, self._cancel_held))

    async def _pass_cancel(self, holder: str, req: CancelRequest) -> CancelReply:
        return await self._pass(holder, subjects.replica_cancel(holder), req, CancelReply)

    async def _pass(
        self, holder: str, subject: str, req: StatusRequest | CancelRequest, model: type[M]
    ) -> M:
        """A request passed on to the replica holding its pipeline, and its answer as given."""
        assert self.o.nc is not None
        try:
            return await request(self.o.nc, subject, req, model, timeout=PASS_S)
        except RemoteError as exc:  # the holder's answer, as it gave it
            env = exc.envelope
            raise ServiceError(env.code, env.message, env.details) from None
        except (TimeoutError, nats.errors.NoRespondersError):
            raise ServiceError(
                "unavailable", f"{holder} holds pipeline {req.pipeline_id} and does not answer"
            ) from None

    async def cancel_lost(self, run: PipelineRun) -> None:
        """This replica cancelled a pipeline while its lease had lapsed, then lost it to an
        adopter, which resumed it from a record that says running: the cancel is passed on
        (the adopter may still be setting the run up: it is asked again a few times)."""
        req = CancelRequest(pipeline_id=run.pipeline_id, reason=run.reason)
        for attempt in range(CANCEL_PASS_TRIES):
            try:
                holder = await self.o.failover.holder(run.pipeline_id)
                if holder is None or holder == self.o.owner:
                    raise ServiceError("unavailable", "held by no other replica yet")
                reply = await self._pass_cancel(holder, req)
                log.info("cancel of %s passed on to %s: %s", run.pipeline_id, holder, reply.state)
                return
            except (ServiceError, TimeoutError, nats.errors.Error) as exc:
                why = exc.message if isinstance(exc, ServiceError) else repr(exc)
            await asyncio.sleep(0.2 * (attempt + 1))  # back off before asking again
        log.warning("cancel of %s not passed on to its new owner: %s", run.pipeline_id, why)

    async def cancel_run(self, run: PipelineRun, reason: str) -> CancelReply:
        asked = lifecycle.CancelAsked(reason)
        await self.o.carry_out(run, lifecycle.step(run, asked, self.o.mono()))
        return CancelReply(pipeline_id=run.pipeline_id, state=run.state)

    async def agents(self, req: AgentsRequest) -> AgentsReply:
        now = self.o.mono()
        alive = {e.advert.agent_id for e in self.o.view.alive(now)}
        full = self.o.store.full_devices(self.o.wall())
        booked = self.o.store.snapshot()  # as planning sees them: less releases not yet written
        out = []
        for aid, entry in sorted(self.o.view.agents.items()):
            if req.alive_only and aid not in alive:
                continue
            adv = entry.advert
            out.append(
                AgentSummary(
                    agent_id=aid,
                    incarnation=adv.incarnation,
                    site=adv.site,
                    tier=adv.tier,
                    alive=aid in alive,
                    devices=[
                        f"{d.device_id}:{d.kind}{' (emulated)' if d.emulated else ''}"
                        for d in adv.devices
                    ],
                    running=entry.running,
                    # when it was last heard, also once health monitoring says it is dead
                    last_seen_s=max(0.0, now - entry.heard),
                    draining=entry.draining and self.o.view.heard_lately(entry, now),
                    queues=self._queues(aid, adv.devices, booked, full),
                    wire=entry.wire,
                )
            )
        return AgentsReply(agents=out)

    def _queues(
        self,
        agent_id: str,
        devices: Iterable[DeviceSpec],
        booked: Mapping[str, Cached],
        full: Collection[str],
    ) -> builtins.list[DeviceQueue]:  # `list` here is the API method
        """The booking keys of an agent's devices: `booked`, the store's snapshot (what
        planning sees; `key_bytes`: the value written); `full`, the devices planning leaves
        alone for a full key."""
        keys = ((d.device_id, device_key(agent_id, d.device_id)) for d in devices)
        return [
            DeviceQueue(
                device_id=dev, windows=len(cached.book.windows),
                key_bytes=self.o.store.sizes.get(key, 0), full=f"{agent_id}:{dev}" in full,
            )
            for dev, key in keys
            if (cached := booked.get(key)) is not None
        ]  # fmt: skip
