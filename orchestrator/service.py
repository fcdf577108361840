"""The orchestrator's asyncio shell: cluster view, API service, dispatch and event tracking."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.micro
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import RetentionPolicy, StreamConfig
from nats.micro.request import Request

from orchestrator.pipelines import PipelineRun
from orchestrator.planning import plan_pipeline
from orchestrator.registry import ClusterView
from orchestrator.scheduling import Unschedulable
from schemas import subjects
from schemas.agent import AgentAdvert, Heartbeat
from schemas.api import (
    AgentsReply,
    AgentsRequest,
    AgentSummary,
    CancelReply,
    CancelRequest,
    ListReply,
    ListRequest,
    PlannedTask,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from schemas.base import WireModel
from schemas.codec import DecodeError, decode, encode
from schemas.events import PipelineEvent, TaskEvent
from schemas.placement import (
    CancelCommand,
    CommitCommand,
    ConsumerRef,
    InputRef,
    OfferReply,
    TaskOffer,
)
from schemas.rpc import RemoteError, ServiceError, handle, request

log = logging.getLogger("mars.orchestrator")
VERSION = "0.1.0"
OFFER_TIMEOUT_S = 2.0
MAX_PIPELINES_KEPT = 10_000


class Orchestrator:
    def __init__(self, nats_url: str, *, misses: int = 3) -> None:
        self.nats_url = nats_url
        self.view = ClusterView(misses)
        self.pipelines: dict[str, PipelineRun] = {}
        self.nc: NATS | None = None
        self._service: Any = None
        self._token = time.time_ns() // 1000
        self._changed = asyncio.Condition()
        self.cluster_changed = asyncio.Event()

    def _now(self) -> float:
        return time.monotonic()

    def next_token(self) -> int:
        self._token += 1
        return self._token

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.nc = await nats.connect(
            self.nats_url,
            name="mars-orchestrator",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )
        nc = self.nc
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.add_stream(
                StreamConfig(
                    name=subjects.EVENTS_STREAM,
                    subjects=[f"{subjects.EVENTS}.>"],
                    retention=RetentionPolicy.LIMITS,
                    max_age=24 * 3600,
                    max_bytes=256 * 1024 * 1024,
                )
            )
        await nc.subscribe(subjects.ALL_ADVERTS, cb=self._on_advert)
        await nc.subscribe(subjects.ALL_HEARTBEATS, cb=self._on_heartbeat)
        await nc.subscribe(subjects.ALL_TASK_EVENTS, cb=self._on_task_event)
        svc = await nats.micro.add_service(
            nc,
            name=subjects.API_SERVICE,
            version=VERSION,
            queue_group=subjects.API_QUEUE,
            description="MARS pipeline API",
        )
        endpoints: list[tuple[str, str, Callable[[Request], Awaitable[None]]]] = [
            ("submit", subjects.SUBMIT, self._ep(SubmitRequest, self.submit)),
            ("status", subjects.STATUS, self._ep(StatusRequest, self.status)),
            ("list", subjects.LIST, self._ep(ListRequest, self.list)),
            ("cancel", subjects.CANCEL, self._ep(CancelRequest, self.cancel)),
            ("agents", subjects.AGENTS, self._ep(AgentsRequest, self.agents)),
        ]
        for name, subject, handler in endpoints:
            await svc.add_endpoint(name=name, subject=subject, handler=handler)
        self._service = svc
        await nc.flush()
        await nc.publish(subjects.DISCOVER, b"")
        log.info("orchestrator up on %s", self.nats_url)

    async def stop(self) -> None:
        if self._service is not None:
            with contextlib.suppress(Exception):
                await self._service.stop()
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.nc = None

    def _ep(
        self, model: type[Any], fn: Callable[[Any], Awaitable[WireModel]]
    ) -> Callable[[Request], Awaitable[None]]:
        async def endpoint(req: Request) -> None:
            body, headers = await handle(req.data, req.headers, model, fn)
            await req.respond(body, headers=headers)

        return endpoint

    # -- cluster view ---------------------------------------------------------------------------
    async def _on_advert(self, msg: Msg) -> None:
        try:
            adv = decode(msg.data, AgentAdvert)
        except DecodeError as exc:
            log.debug("dropped bad advert on %s: %s", msg.subject, exc.message)
            return
        if msg.subject != subjects.advert(adv.agent_id):
            log.debug("dropped advert for %s sent on %s", adv.agent_id, msg.subject)
            return
        if self.view.on_advert(adv, self._now()):
            log.info("agent %s joined (%s, %s)", adv.agent_id, adv.site, adv.tier)
        self.cluster_changed.set()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            hb = decode(msg.data, Heartbeat)
        except DecodeError:
            return
        if msg.subject == subjects.heartbeat(hb.agent_id):
            self.view.on_heartbeat(hb, self._now())

    async def wait_for_agents(self, n: int, timeout: float) -> int:
        """Wait until `n` agents are alive (event-driven); returns how many are."""
        deadline = self._now() + timeout
        while len(self.view.alive(self._now())) < n:
            left = deadline - self._now()
            if left <= 0:
                break
            self.cluster_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.cluster_changed.wait(), left)
        return len(self.view.alive(self._now()))

    # -- events ---------------------------------------------------------------------------------
    async def _on_task_event(self, msg: Msg) -> None:
        try:
            ev = decode(msg.data, TaskEvent)
        except DecodeError:
            return
        run = self.pipelines.get(ev.pipeline_id)
        if run is None:
            return
        new_state = run.apply(ev, self._now())
        if new_state is not None:
            await self._publish_pipeline(run)
            if new_state == "failed":
                await self._cancel_on_agents(run, run.reason)
        async with self._changed:
            self._changed.notify_all()

    async def _publish_pipeline(self, run: PipelineRun) -> None:
        assert self.nc is not None
        ev = PipelineEvent(
            pipeline_id=run.pipeline_id,
            state=run.state,
            reason=run.reason[:2048],
            at_s=max(0.0, self._now() - run.submitted_at),
        )
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.pipeline_event(run.pipeline_id), encode(ev))

    # -- API ------------------------------------------------------------------------------------
    async def submit(self, req: SubmitRequest) -> SubmitReply:
        pid = req.pipeline_id or uuid.uuid4().hex
        existing = self.pipelines.get(pid)
        if existing is not None:
            if existing.spec != req.pipeline:
                raise ServiceError("conflict", f"pipeline id {pid} exists with another spec")
            return self._submit_reply(existing)
        run = PipelineRun(pid, req.pipeline, self._now())
        self._remember(run)
        try:
            planned = plan_pipeline(req.pipeline, self.view, self._now())
        except Unschedulable as exc:
            run.finish("unschedulable", str(exc), self._now())
            details = {
                f"{tid}@{dev}": why
                for tid, per_dev in exc.reasons.items()
                for dev, why in per_dev.items()
            }
            if not details:
                details = {tid: "no live devices" for tid in exc.reasons}
            raise ServiceError(
                "unschedulable", str(exc)[:2048], dict(list(details.items())[:500])
            ) from exc
        plan = planned.plan
        run.algorithm = plan.algorithm
        run.planned_makespan_s = plan.makespan
        run.plan = [
            PlannedTask(
                task_id=p.task_id,
                agent_id=p.device_id.split(":", 1)[0],
                device_id=p.device_id.split(":", 1)[1],
                slot=p.slot,
                start_s=p.start,
                finish_s=p.finish,
            )
            for p in sorted(plan.placements.values(), key=lambda p: (p.start, p.task_id))
        ]
        run.state = "placing"
        await self._dispatch(run)
        return self._submit_reply(run)

    def _submit_reply(self, run: PipelineRun) -> SubmitReply:
        return SubmitReply(
            pipeline_id=run.pipeline_id,
            state=run.state,
            algorithm=run.algorithm,
            makespan_s=run.planned_makespan_s,
            plan=run.plan,
        )

    def _remember(self, run: PipelineRun) -> None:
        self.pipelines[run.pipeline_id] = run
        if len(self.pipelines) > MAX_PIPELINES_KEPT:
            for pid in [p for p, r in self.pipelines.items() if r.terminal][
                : len(self.pipelines) - MAX_PIPELINES_KEPT
            ]:
                del self.pipelines[pid]

    async def _dispatch(self, run: PipelineRun) -> None:
        """Offer every task to its agent; commit only when all accepted."""
        assert self.nc is not None
        where = {p.task_id: p for p in run.plan}
        order = {p.task_id: i for i, p in enumerate(run.plan)}
        consumers: dict[str, list[ConsumerRef]] = {t.id: [] for t in run.spec.tasks}
        for t in run.spec.tasks:
            for d in t.deps:
                consumers[d].append(ConsumerRef(task_id=t.id, agent_id=where[t.id].agent_id))
        offers: list[TaskOffer] = []
        for t in run.spec.tasks:
            p = where[t.id]
            adv = self.view.agents[p.agent_id].advert
            token = self.next_token()
            tr = run.tasks[t.id]
            tr.agent_id, tr.device_id, tr.token = p.agent_id, p.device_id, token
            tr.predicted_s = p.finish_s - p.start_s
            tr.state = "offered"
            offers.append(
                TaskOffer(
                    pipeline_id=run.pipeline_id,
                    agent_id=p.agent_id,
                    incarnation=adv.incarnation,
                    device_id=p.device_id,
                    slot=p.slot,
                    token=token,
                    order=order[t.id],
                    task=t,
                    inputs=[InputRef(task_id=d, agent_id=where[d].agent_id) for d in t.deps],
                    consumers=consumers[t.id],
                )
            )
        replies = await asyncio.gather(*(self._offer(o) for o in offers))
        rejected = [r for r in replies if not r.accepted]
        if rejected:
            reason = "; ".join(f"{r.task_id}@{r.agent_id}: {r.code} {r.reason}" for r in rejected)
            run.finish("failed", f"placement rejected: {reason}", self._now())
            await self._cancel_on_agents(run, run.reason)
            await self._publish_pipeline(run)
            raise ServiceError(
                "conflict",
                run.reason[:2048],
                {f"{r.task_id}@{r.agent_id}": f"{r.code}: {r.reason}" for r in rejected[:500]},
            )
        for tr in run.tasks.values():
            tr.state = "accepted"
        run.committed_at = self._now()
        run.state = "running"
        agents = sorted({o.agent_id for o in offers})
        await asyncio.gather(*(self._commit(a, run, offers) for a in agents))
        await self._publish_pipeline(run)

    async def _offer(self, offer: TaskOffer) -> OfferReply:
        assert self.nc is not None
        try:
            return await request(
                self.nc, subjects.offer(offer.agent_id), offer, OfferReply, timeout=OFFER_TIMEOUT_S
            )
        except (TimeoutError, nats.errors.NoRespondersError, RemoteError) as exc:
            return OfferReply(
                pipeline_id=offer.pipeline_id,
                task_id=offer.task.id,
                agent_id=offer.agent_id,
                accepted=False,
                code="unhealthy",
                reason=f"no answer to offer: {type(exc).__name__} {exc}"[:2048],
            )

    async def _commit(self, agent_id: str, run: PipelineRun, offers: list[TaskOffer]) -> None:
        assert self.nc is not None
        cmd = CommitCommand(
            pipeline_id=run.pipeline_id,
            task_ids=[o.task.id for o in offers if o.agent_id == agent_id],
        )
        try:
            await request(
                self.nc, subjects.commit(agent_id), cmd, CommitCommand, timeout=OFFER_TIMEOUT_S
            )
        except Exception as exc:
            log.warning("commit to %s failed: %s", agent_id, exc)

    async def _cancel_on_agents(self, run: PipelineRun, reason: str) -> None:
        assert self.nc is not None
        cmd = CancelCommand(pipeline_id=run.pipeline_id, reason=reason[:2048])
        agents = sorted({tr.agent_id for tr in run.tasks.values() if tr.agent_id})
        for a in agents:
            with contextlib.suppress(Exception):
                await self.nc.publish(subjects.cancel(a), encode(cmd))

    async def status(self, req: StatusRequest) -> StatusReply:
        run = self.pipelines.get(req.pipeline_id)
        if run is None:
            raise ServiceError("not_found", f"no pipeline {req.pipeline_id}")
        return run.status(self._now())

    async def list(self, req: ListRequest) -> ListReply:
        runs = [r for r in self.pipelines.values() if req.state is None or r.state == req.state]
        runs.sort(key=lambda r: -r.submitted_at)
        return ListReply(pipelines=[r.summary() for r in runs[: req.limit]])

    async def cancel(self, req: CancelRequest) -> CancelReply:
        run = self.pipelines.get(req.pipeline_id)
        if run is None:
            raise ServiceError("not_found", f"no pipeline {req.pipeline_id}")
        if not run.terminal:
            run.finish("cancelled", req.reason or "cancelled by request", self._now())
            await self._cancel_on_agents(run, run.reason)
            await self._publish_pipeline(run)
        return CancelReply(pipeline_id=run.pipeline_id, state=run.state)

    async def agents(self, req: AgentsRequest) -> AgentsReply:
        now = self._now()
        alive = {e.advert.agent_id for e in self.view.alive(now)}
        out = []
        for aid, entry in sorted(self.view.agents.items()):
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
                    last_seen_s=max(0.0, now - entry.last_seen),
                )
            )
        return AgentsReply(agents=out)

    async def wait_terminal(self, pipeline_id: str, timeout: float) -> PipelineRun:
        """In-process wait (used by tests and the demo)."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(
                lambda: pipeline_id in self.pipelines and self.pipelines[pipeline_id].terminal
            )
        return self.pipelines[pipeline_id]


async def run_orchestrator(nats_url: str, stop: asyncio.Event | None = None) -> None:
    orch = Orchestrator(nats_url)
    await orch.start()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await orch.stop()
