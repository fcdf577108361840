"""The agent's asyncio shell: NATS I/O around `AgentCore`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import time
import uuid
from collections.abc import Coroutine
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from edge_agent.config import AgentConfig
from edge_agent.core import AgentCore, Job
from edge_agent.executors import ExecutionError, OnnxExecutor, Output, run_synthetic
from edge_agent.probe import matmul_gflops, probe_host
from schemas import subjects
from schemas.agent import AgentAdvert, DeviceSpec, Heartbeat
from schemas.codec import encode
from schemas.events import TaskEvent, TaskEventState
from schemas.pipeline import OnnxRun, SyntheticRun
from schemas.placement import (
    CancelCommand,
    CommitCommand,
    DataAck,
    DataTransfer,
    OfferReply,
    TaskOffer,
)
from schemas.rpc import RemoteError, request, respond

log = logging.getLogger("mars.agent")
VERSION = "0.1.0"
ADVERT_EVERY = 10  # heartbeats


def build_devices(config: AgentConfig, *, calibrate: bool = True) -> list[DeviceSpec]:
    """Probed CPU (measured) plus the devices the config declares (emulated ones say so)."""
    devices: list[DeviceSpec] = []
    if config.probe_cpu:
        facts = probe_host()
        devices.append(
            DeviceSpec(
                device_id="cpu0",
                kind="cpu",
                slots=config.cpu_slots or facts.logical_cores,
                memory_mb=round(facts.memory_mb, 1),
                gflops=round(matmul_gflops(), 3) if calibrate else 1.0,
                provider="CPUExecutionProvider",
                model_name=facts.cpu_model,
            )
        )
    devices.extend(config.devices)
    if not devices:
        raise ValueError("agent has no devices: enable probe_cpu or declare devices")
    return devices


class Agent:
    def __init__(
        self,
        nats_url: str,
        config: AgentConfig,
        *,
        agent_id: str | None = None,
        calibrate: bool = True,
    ) -> None:
        self.nats_url = nats_url
        self.config = config
        self.agent_id = agent_id or config.agent_id or socket.gethostname().split(".")[0]
        self.incarnation = uuid.uuid4().hex[:16]
        self.devices = build_devices(config, calibrate=calibrate)
        self.onnx = OnnxExecutor(config.models_dir)
        self.core = AgentCore(
            self.agent_id,
            self.incarnation,
            self.devices,
            list(config.allowed_kinds),
            self.onnx.has_model,
        )
        self.nc: NATS | None = None
        self._seq = 0
        self._event_seq = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self._stopped = asyncio.Event()

    # -- lifecycle ------------------------------------------------------------------------------
    def advert(self) -> AgentAdvert:
        return AgentAdvert(
            agent_id=self.agent_id,
            incarnation=self.incarnation,
            site=self.config.site,
            tier=self.config.tier,
            hostname=socket.gethostname()[:256],
            labels=dict(self.config.labels),
            devices=self.devices,
            links=list(self.config.links),
            allowed_kinds=list(self.config.allowed_kinds),
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            version=VERSION,
            seq=self._seq,
        )

    async def start(self) -> None:
        self.nc = await nats.connect(
            self.nats_url,
            name=f"mars-agent-{self.agent_id}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )
        nc = self.nc
        await nc.subscribe(subjects.offer(self.agent_id), cb=self._on_offer)
        await nc.subscribe(subjects.commit(self.agent_id), cb=self._on_commit)
        await nc.subscribe(subjects.cancel(self.agent_id), cb=self._on_cancel)
        await nc.subscribe(subjects.data(self.agent_id), cb=self._on_data)
        await nc.subscribe(subjects.DISCOVER, cb=self._on_discover)
        await nc.flush()
        await self._publish_advert()
        self._spawn(self._heartbeat_loop())
        log.info(
            "agent %s (%s) up with %d devices", self.agent_id, self.incarnation, len(self.devices)
        )

    async def stop(self) -> None:
        self._stopped.set()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.nc is not None and not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
        self.nc = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _publish_advert(self) -> None:
        assert self.nc is not None
        await self.nc.publish(subjects.advert(self.agent_id), encode(self.advert()))

    async def _heartbeat_loop(self) -> None:
        assert self.nc is not None
        interval = self.config.heartbeat_interval_s
        while not self._stopped.is_set():
            self._seq += 1
            hb = Heartbeat(
                agent_id=self.agent_id,
                incarnation=self.incarnation,
                seq=self._seq,
                running=self.core.running_total,
                draining=self.core.draining,
            )
            with contextlib.suppress(Exception):
                await self.nc.publish(subjects.heartbeat(self.agent_id), encode(hb))
                if self._seq % ADVERT_EVERY == 0:
                    await self._publish_advert()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), interval)

    # -- commands -------------------------------------------------------------------------------
    async def _on_discover(self, msg: Msg) -> None:
        await self._publish_advert()

    async def _on_offer(self, msg: Msg) -> None:
        async def admit(offer: TaskOffer) -> OfferReply:
            reply = self.core.admit(offer)
            if not reply.accepted:
                log.info(
                    "rejected %s/%s: %s %s",
                    offer.pipeline_id,
                    offer.task.id,
                    reply.code,
                    reply.reason,
                )
            return reply

        await respond(self.nc, msg, TaskOffer, admit)

    async def _on_commit(self, msg: Msg) -> None:
        async def commit(cmd: CommitCommand) -> CommitCommand:
            self.core.commit(cmd)
            self._start_ready()
            return cmd

        await respond(self.nc, msg, CommitCommand, commit)

    async def _on_cancel(self, msg: Msg) -> None:
        async def cancel(cmd: CancelCommand) -> CancelCommand:
            for job in self.core.cancel(cmd):
                running = self._running.get(job.key)
                if running is not None:
                    running.cancel()
            return cmd

        await respond(self.nc, msg, CancelCommand, cancel)

    async def _on_data(self, msg: Msg) -> None:
        async def deliver(transfer: DataTransfer) -> DataAck:
            return self._deliver(transfer)

        await respond(self.nc, msg, DataTransfer, deliver)

    def _deliver(self, transfer: DataTransfer) -> DataAck:
        if hashlib.sha256(transfer.data).hexdigest() != transfer.sha256:
            return DataAck(
                pipeline_id=transfer.pipeline_id,
                consumer=transfer.consumer,
                ok=False,
                reason="sha256 mismatch",
            )
        ack = self.core.deliver(transfer)
        if ack.ok:
            self._start_ready()
        return ack

    # -- execution ------------------------------------------------------------------------------
    def _start_ready(self) -> None:
        for job in self.core.take_ready():
            self._running[job.key] = self._spawn(self._execute(job))

    def _device(self, job: Job) -> DeviceSpec:
        return self.core.devices[job.offer.device_id]

    async def _execute(self, job: Job) -> None:
        offer = job.offer
        await self._event(job, "started")
        t0 = time.perf_counter()
        ok = False
        try:
            out = await self._run(job)
            duration = time.perf_counter() - t0
            await self._ship_outputs(job, out)
            ok = True
            await self._event(job, "succeeded", duration=duration, output=out)
        except asyncio.CancelledError:
            await self._event(job, "cancelled", duration=time.perf_counter() - t0)
        except Exception as exc:
            log.warning("task %s/%s failed: %s", offer.pipeline_id, offer.task.id, exc)
            await self._event(
                job,
                "failed",
                duration=time.perf_counter() - t0,
                error=f"{type(exc).__name__}: {exc}",
            )
        finally:
            self._running.pop(job.key, None)
            self.core.finish(job.key, ok)
            self._start_ready()

    async def _run(self, job: Job) -> Output:
        run = job.offer.task.run
        device = self._device(job)
        if isinstance(run, SyntheticRun):
            return await run_synthetic(run, device)
        if isinstance(run, OnnxRun):
            return await self.onnx.run(run, device)
        raise ExecutionError(f"no executor for kind {run.kind} in this agent")

    async def _ship_outputs(self, job: Job, out: Output) -> None:
        """Send the output straight to each consumer's agent (never through the cloud)."""
        offer = job.offer
        digest = hashlib.sha256(out.data).hexdigest()
        for consumer in offer.consumers:
            transfer = DataTransfer(
                pipeline_id=offer.pipeline_id,
                producer=offer.task.id,
                consumer=consumer.task_id,
                token=offer.token,
                data=out.data,
                sha256=digest,
            )
            if consumer.agent_id == self.agent_id:
                ack = self._deliver(transfer)
            else:
                ack = await self._send(consumer.agent_id, transfer)
            if not ack.ok:
                raise ExecutionError(f"output not accepted by {consumer.task_id}: {ack.reason}")

    async def _send(self, agent_id: str, transfer: DataTransfer) -> DataAck:
        assert self.nc is not None
        delay = 0.05
        last = "no reply"
        for _ in range(6):
            try:
                ack = await request(
                    self.nc, subjects.data(agent_id), transfer, DataAck, timeout=2.0
                )
                if ack.ok:
                    return ack
                last = ack.reason
            except (TimeoutError, RemoteError, nats.errors.NoRespondersError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(delay)  # back off before retrying a transfer
            delay *= 2
        return DataAck(
            pipeline_id=transfer.pipeline_id, consumer=transfer.consumer, ok=False, reason=last
        )

    async def _event(
        self,
        job: Job,
        state: TaskEventState,
        *,
        duration: float | None = None,
        output: Output | None = None,
        error: str = "",
    ) -> None:
        assert self.nc is not None
        self._event_seq += 1
        offer = job.offer
        ev = TaskEvent(
            event_id=f"{self.incarnation}-{self._event_seq}",
            pipeline_id=offer.pipeline_id,
            task_id=offer.task.id,
            agent_id=self.agent_id,
            incarnation=self.incarnation,
            device_id=offer.device_id,
            token=offer.token,
            state=state,
            duration_s=duration,
            output_bytes=len(output.data) if output else 0,
            result=output.result[:256] if output else "",
            error=error[:2048],
        )
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.task_event(offer.pipeline_id, offer.task.id), encode(ev))


async def run_agent(
    nats_url: str,
    config: AgentConfig,
    *,
    agent_id: str | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    agent = Agent(nats_url, config, agent_id=agent_id)
    await agent.start()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await agent.stop()
