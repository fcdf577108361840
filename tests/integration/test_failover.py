"""Orchestrator fail-over over a real nats-server: a killed replica's pipeline is adopted and
finished by another, a restarted nats-server loses no pipeline, a replica that lost its lease
stops acting."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import nats
import pytest

from orchestrator.infra import procs
from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.placement.placer import PlacementFailed
from orchestrator.reliability import failover
from orchestrator.reservations.store import device_key
from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec, TaskEvent, WireModel, subjects
from schemas.api import CancelRequest, StatusRequest
from schemas.bookings import BookingWindow
from schemas.codec import decode
from schemas.errors import ServiceError
from schemas.events import PipelineEvent
from schemas.failover import (
    OWNERS_BUCKET,
    RUNS_BUCKET,
    OwnerLease,
    PipelineRecord,
    run_key,
    spec_key,
)
from tests.harness import (
    RecordingAgent,
    agent_config,
    start_cluster,
    stop_cluster,
    two_replicas,
)
from transport.client import Client
from transport.rpc import settle

pytestmark = pytest.mark.integration


def configs(n: int = 2) -> dict[str, Any]:
    return {
        f"ag{i}": agent_config("s", "edge", probe_cpu=False, devices=[
            {"device_id": "cpu0", "kind": "cpu", "slots": 1, "gflops": 10.0, "emulated": True}])
        for i in range(n)
    }  # fmt: skip


def chain(name: str, seconds: list[float]) -> PipelineSpec:
    """t0 -> t1 -> ... plus a side branch off t0, each a sleep of the given length."""
    tasks: list[dict[str, Any]] = []
    for i, s in enumerate(seconds):
        deps = [f"t{i - 1}"] if i else []
        tasks.append({"id": f"t{i}", "run": {"kind": "synthetic", "seconds": s}, "deps": deps})
    tasks.append({"id": "side", "run": {"kind": "synthetic", "seconds": 0.1}, "deps": ["t0"]})
    return PipelineSpec.model_validate({"name": name, "tasks": tasks})


class EventTap:
    """A plain subscriber on a pipeline's task events: lets a test wait for one of them."""

    def __init__(self) -> None:
        self.seen: list[TaskEvent] = []
        self.changed = asyncio.Condition()
        self.nc: Any = None

    async def start(self, url: str, pipeline_id: str) -> None:
        self.nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)

        async def on(msg: Any) -> None:
            self.seen.append(decode(msg.data, TaskEvent))
            async with self.changed:
                self.changed.notify_all()

        await self.nc.subscribe(f"{subjects.EVENTS}.task.{pipeline_id}.>", cb=on)
        await settle(self.nc)

    async def wait(self, task_id: str, state: str, timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout), self.changed:
            await self.changed.wait_for(
                lambda: any(e.task_id == task_id and e.state == state for e in self.seen)
            )

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


def ran_once(agents: list[RecordingAgent], pipeline_id: str, spec: PipelineSpec) -> None:
    ran = sorted(rec[1] for a in agents for rec in a.log if rec[0] == pipeline_id)
    assert ran == sorted(t.id for t in spec.tasks), ran


async def kv_value(url: str, bucket: str, key: str) -> bytes:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        value = (await kv.get(key)).value
        assert value is not None
        return bytes(value)
    finally:
        await nc.close()


M = TypeVar("M", bound=WireModel)


async def settled_record(url: str, pid: str, timeout: float = 15.0) -> PipelineRecord:
    """The pipeline's record once it says the pipeline ended (records are written after the
    in-memory state changes, and retried while JetStream is still coming back)."""
    ended = ("succeeded", "failed", "cancelled")
    return await kv_until(
        url, RUNS_BUCKET, run_key(pid), PipelineRecord, lambda r: r.state in ended, timeout
    )


async def kv_until(
    url: str, bucket: str, key: str, cls: type[M], ok: Callable[[M], bool], timeout: float
) -> M:
    """The first value of a key (now or written later) that is `ok`."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        watch = await kv.watch(key)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    entry = await watch.updates(timeout=timeout)
                    if entry is None or entry.value is None:
                        continue  # the end-of-history marker, or a delete
                    value = decode(bytes(entry.value), cls)
                    if ok(value):
                        return value
        finally:
            await watch.stop()
    finally:
        await nc.close()


def hold_renewals(orch: Orchestrator, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """No lease renewal of `orch` gets through (the server away, for it) until the event
    returned is set."""
    leases = orch.failover.leases
    renewing = asyncio.Event()
    renew_all = leases.renew_all

    async def held_back() -> tuple[list[str], list[str]]:
        await renewing.wait()
        return await renew_all()

    monkeypatch.setattr(leases, "renew_all", held_back)
    return renewing


@pytest.fixture
def orch_log(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "orchestrator.log"


async def adopted_after_kill(
    proc: subprocess.Popen[bytes],
    survivor: Orchestrator,
    agents: int,
    tap: EventTap,
    task: str,
    pid: str,
) -> PipelineRun:
    """Start `survivor` and let it see the `agents`; once `task` has started, SIGKILL the
    replica process `proc` (no lease released, nothing flushed); the pipeline as `survivor`
    ends it."""
    await survivor.start()
    assert await survivor.wait_for_agents(agents, 10.0) == agents
    await tap.wait(task, "started")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    return await survivor.wait_terminal(pid, 40.0)


@contextlib.asynccontextmanager
async def adopted_after_its_commit(
    nats_url: str, orch_log: Path, pid: str, lose_job: bool
) -> AsyncIterator[tuple[RecordingAgent, Orchestrator, PipelineRun]]:
    """A real `mars orchestrator` places one task on one agent, which takes the commit and
    does nothing with it (`lose_job`: loses the job too) while the owner lives; the owner
    records the pipeline and is SIGKILLed, and a replica with a 60 s stall time adopts it.
    Yields the agent, the adopter and the pipeline as it ended (within 30 s)."""
    with orch_log.open("wb") as log:
        proc = procs.spawn(["-v", "orchestrator", "--nats", nats_url], log=log)
    agent = RecordingAgent(nats_url, configs(1)["ag0"], agent_id="ag0", calibrate=False)
    commit, taken, deaf = agent.core.commit, asyncio.Event(), [True]

    def commit_unless_deaf(cmd: Any) -> int:
        if not deaf[0]:
            return commit(cmd)
        if lose_job:
            agent.core.jobs.pop((cmd.pipeline_id, "t"), None)
        taken.set()
        return 0

    agent.core.commit = commit_unless_deaf  # type: ignore[method-assign]
    client = await Client.connect(nats_url)
    survivor = None
    one = PipelineSpec.model_validate(
        {"name": "one", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.05}}]}
    )
    try:
        await agent.start()
        assert await client.wait_for_agents(1, timeout=30.0) == 1  # the doomed replica alone
        reply = await client.submit(one, pipeline_id=pid)
        assert reply.state == "running"
        rec = await kv_until(nats_url, RUNS_BUCKET, run_key(pid), PipelineRecord, bool, 10)
        assert rec.tasks[0].status.state == "accepted"
        async with asyncio.timeout(10):
            await taken.wait()  # the owner's commit reached the agent, and did nothing
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deaf[0] = False
        assert agent.log == [] and ((pid, "t") in agent.core.jobs) is not lose_job
        survivor = Orchestrator(nats_url, name="survivor", stall_s=60.0)
        await survivor.start()
        run = await survivor.wait_terminal(pid, 30.0)
        assert run.state == "succeeded", run.reason
        assert survivor.failover.adopted == 1
        yield agent, survivor, run
    finally:
        procs.stop_all([proc])
        await client.close()
        await agent.stop()
        if survivor is not None:
            await survivor.stop()


async def test_an_adopter_commits_what_its_dead_owner_had_not(
    nats_url: str, orch_log: Path
) -> None:
    """The owner answers, records the pipeline and dies before its commit took effect (as if
    lost on the way), so its check a second later died with it. The adopter commits the
    accepted task at once, not when its stall watchdog would have sent the commit again."""
    async with adopted_after_its_commit(nats_url, orch_log, "uncommitted-1", False) as (
        agent, _survivor, run,
    ):  # fmt: skip
        assert [e[1] for e in agent.log] == ["t"]
        assert not [x for x in run.placement_log if "stalled" in x], run.placement_log
        assert run.recoveries == 0  # committed where it was, not placed again


async def test_an_adopter_asks_about_jobs_its_dead_owner_placed(
    nats_url: str, orch_log: Path
) -> None:
    """The agent lost the job as the owner's commit arrived (as a process restarted while its
    owner could not act on it would: the record names the agent, not the incarnation), then
    the owner died. The adopter asks the agent whether it holds the job: `gone`, so the
    task is placed again at once, not when its stall watchdog finds it stalled."""
    async with adopted_after_its_commit(nats_url, orch_log, "lost-job-1", True) as (
        agent, survivor, run,
    ):  # fmt: skip
        assert survivor.watchdog.job_answers == {"gone": 1}
        assert [x for x in run.placement_log if x.startswith("t adopted, asked ag0")]
        assert [e[1] for e in agent.log] == ["t"]


async def test_killed_replica_pipeline_is_adopted_and_finished(
    nats_url: str, orch_log: Path
) -> None:
    with orch_log.open("wb") as log:
        proc = procs.spawn(["-v", "orchestrator", "--nats", nats_url], log=log)
    agents = [
        RecordingAgent(nats_url, c, agent_id=a, calibrate=False) for a, c in configs().items()
    ]
    client = await Client.connect(nats_url)
    tap, survivor = EventTap(), None
    try:
        for a in agents:
            await a.start()
        # only the doomed replica serves the API yet: the submit is its pipeline
        assert await client.wait_for_agents(2, timeout=30.0) == 2
        spec = chain("doomed", [0.2, 0.6, 2.5, 0.5])
        await tap.start(nats_url, "killed-1")
        reply = await client.submit(spec, pipeline_id="killed-1")
        assert reply.state == "running"
        survivor = Orchestrator(nats_url, name="survivor")
        run = await adopted_after_kill(proc, survivor, 2, tap, "t1", "killed-1")
        assert run.state == "succeeded", run.reason
        assert run.owner == "survivor"
        assert survivor.failover.adopted == 1
        assert any("adopted by survivor" in line for line in run.placement_log)
        # every task ran once, and its one result is what the survivor holds
        ran_once(agents, "killed-1", spec)
        assert all(tr.state == "succeeded" and tr.result for tr in run.tasks.values())
        st = await client.status("killed-1")
        assert st.state == "succeeded" and st.owner == "survivor"
        rec = decode(await kv_value(nats_url, RUNS_BUCKET, run_key("killed-1")), PipelineRecord)
        assert rec.epoch == 2 and rec.adoptions == 1 and rec.state == "succeeded"
        lease = decode(await kv_value(nats_url, OWNERS_BUCKET, "killed-1"), OwnerLease)
        assert lease.owner == "survivor" and lease.expires == 0.0  # done: nobody adopts it
    finally:
        procs.stop_all([proc])
        await tap.close()
        await client.close()
        for a in agents:
            await a.stop()
        if survivor is not None:
            await survivor.stop()


async def test_nats_server_restart_loses_no_pipeline(nats_server: EmbeddedNats) -> None:
    url = nats_server.url
    # three agents: losing them all at once reads as a partition (re-placement paused), which
    # is what a server restart looks like from the orchestrator
    orch, agents = await start_cluster(url, configs(3))
    tap = EventTap()
    # a long-lived client: its connection outlasts the restart (reconnecting for ever)
    client = await Client.connect(url, reconnects=-1)
    assert client.nc.options["max_reconnect_attempts"] == -1
    try:
        spec = chain("restart", [0.2, 0.8, 0.8, 0.3])
        await tap.start(url, "restart-1")
        reply = await orch.submit_spec(spec, "restart-1")
        assert reply.state == "running"
        await tap.wait("t1", "started")
        # the server goes away mid-pipeline, then comes back on the same port and store
        await asyncio.to_thread(nats_server.stop)
        await asyncio.wait_for(agents[0].offline.wait(), 10.0)
        await asyncio.to_thread(nats_server.start)
        run = await orch.wait_terminal("restart-1", 40.0)
        assert run.state == "succeeded", run.reason
        assert all(tr.state == "succeeded" for tr in run.tasks.values())
        rec = await settled_record(url, "restart-1")
        assert rec.state == "succeeded" and rec.owner == orch.owner
        assert (await client.status("restart-1")).state == "succeeded"  # the same connection
        # and the state survived on disk: a pipeline submitted after the restart works too
        again = await orch.submit_spec(chain("after", [0.05, 0.05]), "restart-2")
        assert again.state == "running"
        assert (await orch.wait_terminal("restart-2", 20.0)).state == "succeeded"
    finally:
        await client.close()
        await tap.close()
        await stop_cluster(orch, agents)


async def test_after_a_server_outage_longer_than_a_lease_owners_keep_their_pipelines(
    nats_server: EmbeddedNats,
) -> None:
    """The server is away longer than an ownership lease: every lease lapses with its owner
    alive. Back, the owner renews its own; the other replica, back too, adopts nothing
    for a while (`ADOPT_HOLD_LEASES`). Before, whoever came back first adopted the other's
    pipelines, and every pipeline changed hands."""
    url = nats_server.url
    async with two_replicas(url, configs(), "first", "second") as (first, second, _):
        assert await second.wait_for_agents(2, 10.0) == 2
        await first.submit_spec(chain("outage", [0.2, 6.0, 0.2]), "outage-1")
        lease = first.failover.lease_s + first.failover.grace_s
        await asyncio.to_thread(nats_server.stop)
        await asyncio.sleep(lease + 1.5)  # the outage's length: past every lease
        await asyncio.to_thread(nats_server.start)
        run = await first.wait_terminal("outage-1", 30.0)
        assert run.state == "succeeded", run.reason
        assert (first.failover.lost, second.failover.adopted) == (0, 0)
        rec = await settled_record(url, "outage-1")
        assert rec.owner == first.owner and rec.epoch == 1


async def adopted_during_the_hold(second: Orchestrator, url: str, pid: str, within: float) -> None:
    """`second`, back from an outage, adopts `pid` (within `within` s) before its adoption
    hold ends, and the pipeline succeeds under it."""
    await second.wait_for(lambda: pid in second.pipelines, within)
    assert second.failover.adopted == 1
    assert second.mono() < second.failover._adopt_from  # the hold had not ended
    run = await second.wait_terminal(pid, 30.0)
    assert run.state == "succeeded", run.reason
    assert (await settled_record(url, pid)).owner == "second"


@pytest.mark.parametrize("second_holds", [True, False], ids=["renewing", "holding-none"])
async def test_after_a_server_outage_a_lease_that_had_lapsed_before_it_is_adopted_at_once(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch, second_holds: bool
) -> None:
    """first stops renewing (frozen, as a replica that died) and its lease on frozen-1
    lapses while the server is up; second, which would adopt it, has not looked yet when the
    server goes away. Back, second holds off adopting leases that may have lapsed only while
    the server was away (`ADOPT_HOLD_LEASES`), but this one lapsed before: a renewal of
    second's own (or, renewing none, a JetStream request of its own: `confirm_up`), sent
    after the lapse and answered, says the server was up then. It is adopted at once, not
    when the hold ends (booking_stress, a replica killed 3 s before a 3 s outage: 16.0 s
    pipelines)."""
    url = nats_server.url
    async with two_replicas(url, configs(), "first", "second") as (first, second, _):
        assert await second.wait_for_agents(2, 10.0) == 2
        if second_holds:
            await second.submit_spec(chain("mine", [8.0]), "mine-1")  # a lease second renews
        await first.submit_spec(chain("frozen", [8.0]), "frozen-1")
        leases, blind = second.failover.leases, [True]
        expired = leases.expired
        monkeypatch.setattr(leases, "expired", lambda: [] if blind[0] else expired())

        def up_after_lapse() -> bool:
            seen = leases.seen.get("frozen-1")
            lapsed = math.inf if seen is None else seen[0].expires + leases.grace_s
            return max(leases.up_at.values(), default=-math.inf) > lapsed

        first.failover.suspend()
        await leases.wait_until(up_after_lapse, 15.0)
        assert bool(leases.held) == second_holds
        await asyncio.to_thread(nats_server.stop)  # how long it is away does not matter here:
        await asyncio.to_thread(nats_server.start)  # second's reconnect starts the hold
        blind[0] = False
        await adopted_during_the_hold(second, url, "frozen-1", 20.0)


async def test_after_a_server_outage_a_lease_renewed_since_and_lapsed_is_adopted_at_once(
    nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """first is back from the outage, renews its lease on late-1, then dies (frozen): its
    lease lapses with the server up, as it would have without the outage. second, back too,
    holds off adopting leases last renewed before it was back (their owners may be on their
    way), not one renewed since (its expiry a lease length or more after second was back): it
    adopts late-1 as soon as it lapses, not when the hold ends."""
    monkeypatch.setattr(failover, "ADOPT_HOLD_LEASES", 6.0)  # a hold far longer than a lapse
    url = nats_server.url
    async with two_replicas(url, configs(), "first", "second") as (first, second, _):
        assert await second.wait_for_agents(2, 10.0) == 2
        await first.submit_spec(chain("late", [8.0]), "late-1")
        # recorded before the outage (else its adopter finds no record and places it anew)
        await kv_until(url, RUNS_BUCKET, run_key("late-1"), PipelineRecord, lambda r: True, 10.0)
        leases, f = second.failover.leases, second.failover

        def renewed_since() -> bool:  # first renewed it since second was back
            seen = leases.seen.get("late-1")
            back = f._back_at  # when second noticed it was back (-inf before the outage)
            return seen is not None and back > -math.inf and seen[0].expires >= back + f.lease_s

        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)  # second's reconnect starts the hold
        await leases.wait_until(renewed_since, 15.0)
        first.failover.suspend()
        await adopted_during_the_hold(second, url, "late-1", 12.0)


async def test_replica_that_lost_its_lease_stops_acting(nats_url: str) -> None:
    first, agents = await start_cluster(nats_url, configs())
    second = Orchestrator(nats_url, name="second")
    await second.start()
    tap = EventTap()
    try:
        assert await second.wait_for_agents(2, 10.0) == 2
        spec = chain("fenced", [0.2, 2.0, 0.3])
        await tap.start(nats_url, "fenced-1")
        await first.submit_spec(spec, "fenced-1")
        await tap.wait("t1", "started")
        stale = first.pipelines["fenced-1"]
        first.failover.suspend()  # frozen or partitioned: it stops renewing
        # the second replica takes the pipeline over once the lease has expired
        await second.wait_for(lambda: "fenced-1" in second.pipelines, 20.0)
        assert not first.failover.may_act("fenced-1")
        run = await second.wait_terminal("fenced-1", 30.0)
        assert run.state == "succeeded", run.reason
        # the old owner applied nothing after losing the lease, and may write nothing
        assert not stale.terminal
        # asked, it answers with the new owner's account, not its own frozen copy
        assert (await first.status_of("fenced-1")).state == "succeeded"
        before = first.failover.fenced_writes
        await first.persist(stale)
        assert first.failover.fenced_writes == before + 1
        rec = decode(await kv_value(nats_url, RUNS_BUCKET, run_key("fenced-1")), PipelineRecord)
        assert rec.owner == "second" and rec.state == "succeeded" and rec.epoch == 2
        # when it wakes up its renewal loses the CAS race: it drops the pipeline
        lost, _ = await first.failover.leases.renew_all()
        assert lost == ["fenced-1"]
        assert "fenced-1" not in first.failover.leases.held
        ran_once(agents, "fenced-1", spec)
    finally:
        await tap.close()
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)


async def test_progress_records_are_rate_limited(nats_url: str) -> None:
    """A pipeline of many short tasks writes its resumable record at submit, at most once per
    PROGRESS_EVERY_S while it runs, and at the end: not once per finished task."""
    import math
    import time

    from orchestrator.reliability.failover import PROGRESS_EVERY_S

    orch, agents = await start_cluster(nats_url, configs(1))
    try:
        spec = chain("many", [0.01] * 20)
        before = orch.failover.record_writes
        t0 = time.monotonic()
        await orch.submit_spec(spec, "many-1")
        run = await orch.wait_terminal("many-1", 30.0)
        elapsed = time.monotonic() - t0
        assert run.state == "succeeded", run.reason
        writes = orch.failover.record_writes - before
        assert writes <= 2 + math.ceil(elapsed / PROGRESS_EVERY_S), (writes, elapsed)
        assert writes < len(spec.tasks)
        rec = decode(await kv_value(nats_url, RUNS_BUCKET, run_key("many-1")), PipelineRecord)
        assert rec.state == "succeeded"  # the final state is never rate-limited away
    finally:
        await stop_cluster(orch, agents)


async def test_a_cancelled_pipeline_is_recorded_before_anyone_hears_it_ended(
    nats_url: str,
) -> None:
    """Whoever hears the terminal pipeline event and asks another replica (which answers from
    the record) gets the terminal state: the record is written before the event goes out."""
    orch, agents = await start_cluster(nats_url, configs(1))
    nc = await nats.connect(nats_url)
    kv = await nc.jetstream().key_value(RUNS_BUCKET)
    read: list[str] = []
    heard = asyncio.Event()

    async def on_event(msg: Any) -> None:
        ev = decode(msg.data, PipelineEvent)
        if ev.state == "cancelled":  # read the record the moment the end is heard
            try:
                entry = await kv.get(run_key("c-1"))
                read.append(decode(bytes(entry.value or b""), PipelineRecord).state)
            except Exception as exc:  # no record yet: said as such, below
                read.append(type(exc).__name__)
            heard.set()

    try:
        await nc.subscribe(subjects.pipeline_event("c-1"), cb=on_event)
        await settle(nc)
        await orch.submit_spec(chain("c", [5.0]), "c-1")
        await orch.queries.cancel(CancelRequest(pipeline_id="c-1", reason="test"))
        async with asyncio.timeout(10):
            await heard.wait()
        assert read == ["cancelled"]
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_pipeline_not_recorded_yet_is_answered_by_its_holder_elsewhere(
    nats_url: str,
) -> None:
    """Its owner writes a new pipeline's first record after the submit reply: meanwhile
    another replica passes a status on to the holder, which answers from memory (it said
    `unavailable`, ask again); never that the pipeline does not exist."""
    orch, agents = await start_cluster(nats_url, configs(1))
    other = Orchestrator(nats_url, name="orch-other")
    await other.start()
    hold = asyncio.Event()
    persist = orch.persist

    async def held(run: PipelineRun) -> None:
        await hold.wait()
        await persist(run)

    orch.persist = held  # type: ignore[method-assign]
    try:
        await orch.submit_spec(chain("u", [1.0]), "u-1")
        st = await other.queries.status(StatusRequest(pipeline_id="u-1"))  # no record: the holder's
        assert st.state == "running" and st.owner == orch.owner
        found = await orch.failover.runs.record("u-1")
        assert found is None  # not from a record
        # a replica asked for a pipeline it does not hold refuses, not passes it on again
        with pytest.raises(ServiceError) as err:
            await other.queries._status_held(StatusRequest(pipeline_id="u-1"))
        assert err.value.code == "unavailable"
        with pytest.raises(ServiceError) as err:
            await other.queries.status(StatusRequest(pipeline_id="never-submitted"))
        assert err.value.code == "not_found"
        hold.set()
        await persist(orch.pipelines["u-1"])  # the first record, written
        st = await other.queries.status(StatusRequest(pipeline_id="u-1"))
        assert st.state == "running" and st.owner == orch.owner
    finally:
        hold.set()
        await other.stop()
        await stop_cluster(orch, agents)


async def test_a_pipeline_that_ends_while_its_record_is_written_is_recorded_ended(
    nats_url: str,
) -> None:
    """The record of a pipeline that ended while an earlier record (saying it runs) was on its
    way is written again, ended: the write on its way must not count as the final one."""
    orch, agents = await start_cluster(nats_url, configs(1))
    entered, gate = asyncio.Event(), asyncio.Event()
    write = orch.failover.runs.write

    async def held(fields: dict[str, Any], last: int | None) -> int:
        entered.set()
        await gate.wait()
        return await write(fields, last)

    orch.failover.runs.write = held  # type: ignore[method-assign]
    try:
        await orch.submit_spec(chain("w", [5.0]), "w-1")
        await entered.wait()  # the first record, saying `running`, is on its way
        run = orch.pipelines["w-1"]
        run.finish("cancelled", "ended while its record was being written", orch.mono())
        ended = asyncio.create_task(orch.finished(run))  # queues behind that write
        gate.set()
        await ended
        rec = decode(await kv_value(nats_url, RUNS_BUCKET, run_key("w-1")), PipelineRecord)
        assert rec.state == "cancelled"
    finally:
        gate.set()
        await stop_cluster(orch, agents)


def hold_records_and_commits(orch: Orchestrator) -> asyncio.Event:
    """Its records and commits wait until the event is set (an owner about to die before
    its first record, its commits not yet out)."""
    hold = asyncio.Event()
    persist, commit = orch.persist, orch.commits.commit_all

    async def held_persist(run: PipelineRun) -> None:
        await hold.wait()
        await persist(run)

    async def held_commit(run: PipelineRun, task_ids: set[str], **kw: Any) -> None:
        await hold.wait()
        await commit(run, task_ids, **kw)

    orch.persist = held_persist  # type: ignore[method-assign]
    orch.commits.commit_all = held_commit  # type: ignore[method-assign]
    return hold


async def test_a_pipeline_answered_but_never_recorded_is_placed_anew_by_its_adopter(
    nats_url: str,
) -> None:
    """Its owner answered the submit and died before its first record (and before its
    commits went out): the spec is on the bucket before any answer, so the replica that
    adopts the pipeline finds it with no record, knows it was answered, and places it anew.
    Before, it was given up: a pipeline its client had been told was placed never ended."""
    first, agents = await start_cluster(nats_url, configs())
    second = Orchestrator(nats_url, name="second")
    await second.start()
    hold = hold_records_and_commits(first)
    try:
        assert await second.wait_for_agents(2, 10.0) == 2
        spec = chain("anew", [0.2, 0.2])
        reply = await first.submit_spec(spec, "anew-1")
        assert reply.state == "running"
        # answered: its spec was written before the answer, its record not
        assert decode(await kv_value(nats_url, RUNS_BUCKET, spec_key("anew-1")), PipelineSpec) == (
            spec
        )
        assert await first.failover.runs.record("anew-1") is None
        first.failover.suspend()  # it dies here: nothing more from it
        await second.wait_for(lambda: "anew-1" in second.pipelines, 20.0)
        run = await second.wait_terminal("anew-1", 30.0)
        assert run.state == "succeeded", run.reason
        assert second.failover.placed_anew == 1
        assert any(x.endswith("with no record: placed anew") for x in run.placement_log)
        ran_once(agents, "anew-1", spec)  # the first owner's commits never went out
        rec = decode(await kv_value(nats_url, RUNS_BUCKET, run_key("anew-1")), PipelineRecord)
        assert rec.owner == "second" and rec.state == "succeeded"
    finally:
        hold.set()
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)


async def test_a_pipeline_recorded_while_it_was_being_placed_is_placed_anew_by_its_adopter(
    nats_url: str,
) -> None:
    """Its owner wrote its record while placing it (as one back from an outage does for what
    it holds, `Failover.catch_up`) and died before the placement ended: the record says
    `placing`, every task pending. Its adopter places it anew, as one never recorded. Before,
    it resumed the record as it was and the pipeline stayed `placing` for good
    (booking_stress seed 720: a replica killed 1 s after a server restart)."""
    never = asyncio.Event()
    async with two_replicas(nats_url, configs(), "first", "second") as (first, second, _):

        async def dies_placing(run: PipelineRun, **kw: Any) -> None:
            gate = kw.get("gate")
            if gate is not None:
                await gate  # its claim: the lease is first's
            await first.persist(run)  # a record of it while placing
            await never.wait()  # ... and nothing more from it

        first.placer.place = dies_placing  # type: ignore[method-assign, assignment]
        submit = asyncio.create_task(first.submit_spec(chain("mid", [0.2, 0.2]), "mid-1"))
        try:
            assert await second.wait_for_agents(2, 10.0) == 2
            rec = await kv_until(
                nats_url, RUNS_BUCKET, run_key("mid-1"), PipelineRecord, lambda r: True, 10.0
            )
            assert rec.state == "placing" and rec.owner == "first"
            first.failover.suspend()  # it dies here
            run = await second.wait_terminal("mid-1", 30.0)
            assert run.state == "succeeded", run.reason
            assert second.failover.placed_anew == 1
            placed_anew = "before its placement committed: placed anew"
            assert any(placed_anew in x for x in run.placement_log)
            rec = await settled_record(nats_url, "mid-1")
            assert rec.owner == "second" and rec.state == "succeeded"
        finally:
            submit.cancel()
            with contextlib.suppress(BaseException):
                await submit


async def test_a_pipeline_adopted_with_no_agent_up_waits_for_one(
    nats_url: str,
) -> None:
    """Answered and never recorded, its owner dead, and no agent up when it is adopted (the
    fleet not back from the same outage): placed anew, it finds no device; it waits, held
    by its adopter, and is placed once an agent is up. Before, it was ended as unschedulable
    (a pipeline its client had been told was placed failed for the outage); then, let go, it
    was adopted and placed anew again every few seconds, a warning each time."""
    first, agents = await start_cluster(nats_url, configs())
    second = Orchestrator(nats_url, name="second")
    await second.start()
    hold = hold_records_and_commits(first)
    late: RecordingAgent | None = None
    try:
        assert await second.wait_for_agents(2, 10.0) == 2
        spec = chain("bare", [0.2, 0.2])
        assert (await first.submit_spec(spec, "bare-1")).state == "running"
        for a in agents:
            await a.stop()
        async with asyncio.timeout(10.0):  # each verdict sets cluster_changed
            while True:
                second.cluster_changed.clear()
                if not second.view.alive(second.mono()):
                    break
                await second.cluster_changed.wait()
        first.failover.suspend()  # it dies here: nothing more from it
        await second.wait_for(lambda: second.failover.placed_anew == 1, 20.0)
        waiting = second.pipelines["bare-1"]  # held, waiting: not ended, not let go
        assert waiting.state == "placing" and second.failover.may_act("bare-1")
        assert (await second.status_of("bare-1")).state == "placing"
        # no record: any other replica passes a status on to the holder (the first, which
        # held it before, included: its own copy stands still)
        assert (await first.status_of("bare-1")).state == "placing"
        late = RecordingAgent(nats_url, configs(1)["ag0"], agent_id="late", calibrate=False)
        await late.start()
        run = await second.wait_terminal("bare-1", 30.0)
        assert run.state == "succeeded", run.reason
        assert second.failover.placed_anew == 1  # adopted once, not again and again
        assert {tr.agent_id for tr in run.tasks.values()} == {"late"}
    finally:
        hold.set()
        if late is not None:
            await late.stop()
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)


async def test_an_id_claimed_by_a_replica_that_died_before_answering_is_freed(
    nats_url: str,
) -> None:
    """A replica claimed an id and died before writing anything else: nobody was told of the
    pipeline. Its adopter frees the id, and the client's submit of it again is placed. Before,
    the id stayed taken for good: every submit of it was refused, "being placed" by the dead.
    The window it had booked for it goes at once, and so does one of a pipeline it had ended
    (its release not written yet): before, both held their device until their lease ran out."""
    first, agents = await start_cluster(nats_url, configs())
    second = Orchestrator(nats_url, name="second")
    await second.start()
    try:
        await first.failover.leases.claim("lost-1")
        # and booked a window for it, lasting a minute unless given back
        key, now = device_key("ag0", "cpu0"), first.wall()
        window = BookingWindow(
            pipeline_id="lost-1", task_id="t0", slot=0, start=now + 30, end=now + 31,
            expires=now + 60, owner=first.owner,
        )  # fmt: skip
        assert (await first.store.book(key, [window], now)).ok
        # and ended "done-1" there, its window's release not written yet when it died
        await first.failover.leases.claim("done-1")
        await first.failover.leases.release("done-1")  # the lease kept as done
        ended = window.model_copy(update={"pipeline_id": "done-1", "start": now + 40,
                                          "end": now + 41})  # fmt: skip
        assert (await first.store.book(key, [ended], now)).ok
        first.failover.suspend()
        with pytest.raises(ServiceError) as err:  # while its claim holds: ask again later
            await second.submit_spec(chain("lost", [0.1]), "lost-1")
        assert err.value.code == "conflict" and "being placed by" in err.value.message
        await second.wait_for(lambda: second.failover.freed == 1, 20.0)

        def stray() -> bool:
            cur = second.store.cache.get(key)
            return cur is not None and any(
                w.pipeline_id in ("lost-1", "done-1") for w in cur.book.windows
            )

        # its window goes with it, and the ended pipeline's too, now (not in a minute)
        await second.store.wait_until(lambda: not stray(), 5.0)
        reply = await second.submit_spec(chain("lost", [0.1]), "lost-1")
        assert reply.state == "running"
        run = await second.wait_terminal("lost-1", 20.0)
        assert run.state == "succeeded", run.reason
        lease = decode(await kv_value(nats_url, OWNERS_BUCKET, "lost-1"), OwnerLease)
        assert lease.owner == "second"
    finally:
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)


async def assert_refused_and_free(
    orch: Orchestrator, spec: PipelineSpec, pid: str, says: str
) -> None:
    """Its submit is `unavailable` (saying `says`) and nothing is kept of it: no run, no
    spec, no lease (the id is free for the submit again)."""
    with pytest.raises(ServiceError) as err:
        await orch.submit_spec(spec, pid)
    assert err.value.code == "unavailable" and says in err.value.message
    assert pid not in orch.pipelines and pid not in orch.failover.leases.held
    assert await orch.failover.runs.spec(pid) is None
    assert await orch.failover.leases.read(pid) is None


async def assert_placed(orch: Orchestrator, spec: PipelineSpec, pid: str) -> None:
    """Submitted (again), it is placed and succeeds."""
    reply = await orch.submit_spec(spec, pid)
    assert reply.state == "running"
    assert (await orch.wait_terminal(pid, 10.0)).state == "succeeded"


async def test_a_submit_with_no_agent_up_is_unavailable_and_its_id_stays_free(
    nats_url: str,
) -> None:
    """No agent is up (a site restarting): a submit is refused as `unavailable`, nothing is
    kept of it, and the same id submitted once agents are back is placed. Before, it was
    refused as unschedulable and ended: every later submit of the id got that end back."""
    orch = Orchestrator(nats_url, name="lonely")
    await orch.start()
    agents: list[RecordingAgent] = []
    try:
        spec = chain("early", [0.1])
        await assert_refused_and_free(orch, spec, "early-1", "no agent is up")
        agent = RecordingAgent(nats_url, configs(1)["ag0"], agent_id="ag0", calibrate=False)
        await agent.start()
        agents.append(agent)
        assert await orch.wait_for_agents(1, 10.0) == 1
        await assert_placed(orch, spec, "early-1")
    finally:
        for a in agents:
            await a.stop()
        await orch.stop()


async def test_an_agent_back_while_the_claim_is_awaited_still_makes_it_unavailable(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan found no device at all, and an agent advertised before the claim's answer:
    the refusal is still `unavailable` (the id free), judged by what the plan saw. Before,
    it was judged by the view after the claim: refused as unschedulable, and ended."""
    orch = Orchestrator(nats_url, name="racing")
    await orch.start()
    agent = RecordingAgent(nats_url, configs(1)["ag0"], agent_id="ag0", calibrate=False)
    plan_failed = asyncio.Event()
    place, own = orch.placer.place, orch.submissions.own

    async def failing_place(*a: Any, **kw: Any) -> None:
        try:
            await place(*a, **kw)
        except PlacementFailed:
            plan_failed.set()
            raise

    async def late_own(run: PipelineRun) -> None:
        await own(run)
        await plan_failed.wait()
        await agent.start()  # back before the claim is answered
        assert await orch.wait_for_agents(1, 10.0) == 1

    monkeypatch.setattr(orch.placer, "place", failing_place)
    monkeypatch.setattr(orch.submissions, "own", late_own)
    try:
        spec = chain("race", [0.1])
        await assert_refused_and_free(orch, spec, "race-1", "no agent is up")
        monkeypatch.undo()
        await assert_placed(orch, spec, "race-1")
    finally:
        await agent.stop()
        await orch.stop()


async def test_a_pipeline_that_ended_while_its_lease_lapsed_is_recorded_once_resumed(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It ended while its lease had lapsed (a server restart longer than the lease; here a
    cancel, or an end whose write failed as the server went): the end is not written then
    (fenced), nor told; once the lease is renewed the record says it ended, then its end is
    told, and the lease is given back. Before, a pipeline that had ended was skipped on
    resuming: other replicas answered `status` from its last running record, and its lease
    was renewed for ever; and its end was told at once, while the record said running."""
    orch, agents = await start_cluster(nats_url, configs(1))
    leases = orch.failover.leases
    renewing = hold_renewals(orch, monkeypatch)  # the server away: no renewal gets through
    # who hears the end, and what the record said when it was heard
    nc = await nats.connect(nats_url)
    heard: list[tuple[str, str | None]] = []
    told = asyncio.Event()

    async def on_end(msg: Any) -> None:
        ev = decode(msg.data, PipelineEvent)
        if ev.state in ("succeeded", "failed", "cancelled"):
            found = await orch.failover.runs.record("lapse-1")
            heard.append((ev.state, None if found is None else found[0].state))
            told.set()

    await nc.subscribe(subjects.pipeline_event("lapse-1"), cb=on_end)
    await settle(nc)
    try:
        reply = await orch.submit_spec(chain("lapse", [0.05, 5.0]), "lapse-1")
        assert reply.state == "running"
        leases.held["lapse-1"].valid_until = orch.mono()  # what an unrenewed lease comes to
        assert not orch.failover.may_act("lapse-1")
        await orch.queries.cancel(CancelRequest(pipeline_id="lapse-1", reason="lapsed"))
        assert (await orch.wait_terminal("lapse-1", 10.0)).state == "cancelled"
        found = await orch.failover.runs.record("lapse-1")
        assert found is None or found[0].state == "running"  # fenced: its end not written
        assert orch.nc is not None
        await orch.nc.flush()  # anything it published is at the server, and reaches us
        await settle(nc)  # before this round trip ends
        assert heard == []  # not told while its record says otherwise
        renewing.set()
        rec = await settled_record(nats_url, "lapse-1")
        assert rec.state == "cancelled" and rec.owner == orch.owner
        await asyncio.wait_for(told.wait(), 5.0)
        assert heard == [("cancelled", "cancelled")]  # told once recorded
        # given back as done (not renewed for ever)
        await kv_until(nats_url, OWNERS_BUCKET, "lapse-1", OwnerLease, lambda x: not x.expires, 5)
        assert "lapse-1" not in leases.held
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_placement_that_nats_fails_part_way_keeps_nothing_and_its_id_stays_free(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A booking write fails mid-placement (the server going away; here one injected into
    the store's write): the submit is `unavailable`, nothing is kept of the pipeline, and
    the same id submitted again is placed. Before, the run stayed "placing" for ever, its
    lease renewed, and every resubmit was answered with it."""
    orch, agents = await start_cluster(nats_url, configs(1))
    book = orch.store.book
    writes: list[str] = []

    async def failing_book(key: str, *a: Any, **kw: Any) -> Any:
        writes.append(key)
        raise nats.errors.NoRespondersError  # what a JetStream write gets with no server

    monkeypatch.setattr(orch.store, "book", failing_book)
    try:
        spec = chain("partway", [0.1])
        await assert_refused_and_free(orch, spec, "partway-1", "failed part-way")
        assert writes == ["dev.ag0.cpu0"]  # it failed at its booking write, not before
        monkeypatch.setattr(orch.store, "book", book)
        await assert_placed(orch, spec, "partway-1")
    finally:
        await stop_cluster(orch, agents)


async def test_a_submit_is_answered_only_once_its_spec_is_written(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec write that begins with the claim fails (JetStream slow just after a server
    restart; here one injected into the write): it is tried again before the submit is
    answered. Written then, the pipeline is placed as usual; never written, nothing of it is
    kept, its offers are withdrawn, and its client is told `unavailable`. Before, it was
    answered all the same: a replica adopting it before its first record found neither spec
    nor record, freed its id, and the client waited for an end that never came."""
    orch, agents = await start_cluster(nats_url, configs(1))
    save_spec = orch.failover.runs.save_spec
    failing = [1]  # writes still to fail

    async def flaky_save_spec(pid: str, spec: PipelineSpec) -> None:
        if failing[0]:
            failing[0] -= 1
            raise nats.errors.TimeoutError
        await save_spec(pid, spec)

    monkeypatch.setattr(orch.failover.runs, "save_spec", flaky_save_spec)
    try:
        spec = chain("spec", [0.1])
        await assert_placed(orch, spec, "spec-1")  # written at its second try
        assert await orch.failover.runs.spec("spec-1") == spec
        failing[0] = 1 + failover.SPEC_RETRIES  # never written
        await assert_refused_and_free(orch, spec, "spec-2", "spec could not be written")
        assert {e[0] for e in agents[0].log} == {"spec-1"}  # spec-2's tasks never ran
        assert not [k for k in agents[0].core.jobs if k[0] == "spec-2"]  # withdrawn
        await assert_placed(orch, spec, "spec-2")  # its id free, and placed once it can be
    finally:
        await stop_cluster(orch, agents)


async def test_a_placement_being_given_up_answers_nobody_as_placed(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A placement's booking write hangs, then fails (the server coming back; here one
    injected into the store's write), and its offers' withdrawal is slow: its client,
    unanswered, sends the submit again and another replica gets it, while the first is still
    placing and while it gives up. Neither time may that client be told the pipeline is
    placed: it is asked to ask again (`conflict`, "being placed by"), and once the first has
    given up, the id is free and the submit placed. Before, the other replica asked the
    lease's holder, which answered "placing" from its run, so the client took its submit as
    answered and waited for an end that never came (booking_stress seeds 515, 516, 518:
    "not terminal 120 s after submit", then `not_found`)."""
    first, agents = await start_cluster(nats_url, configs(1), name="first")
    second = Orchestrator(nats_url, name="second")
    await second.start()
    booking, fail_now = asyncio.Event(), asyncio.Event()
    giving_up, go_on = asyncio.Event(), asyncio.Event()
    withdrawn = first.placer.withdrawn

    async def hanging_book(key: str, *a: Any, **kw: Any) -> Any:
        booking.set()
        await fail_now.wait()
        raise nats.errors.TimeoutError  # a JetStream write the server did not answer in time

    async def slow_withdrawal(pid: str) -> None:
        giving_up.set()
        await go_on.wait()
        await withdrawn(pid)

    async def asked_again() -> None:
        with pytest.raises(ServiceError) as again:
            await second.submit_spec(spec, "given-1")
        assert again.value.code == "conflict" and "being placed by first" in again.value.message

    monkeypatch.setattr(first.store, "book", hanging_book)
    monkeypatch.setattr(first.placer, "withdrawn", slow_withdrawal)
    spec = chain("given", [0.1])
    submitted = asyncio.ensure_future(first.submit_spec(spec, "given-1"))
    try:
        assert await second.wait_for_agents(1, 10.0) == 1
        await asyncio.wait_for(booking.wait(), 10.0)
        await asked_again()  # still placing there
        fail_now.set()
        await asyncio.wait_for(giving_up.wait(), 10.0)
        await asked_again()  # being given up there
        with pytest.raises(ServiceError) as status:
            await second.status_of("given-1")
        assert status.value.code == "unavailable"
        go_on.set()
        with pytest.raises(ServiceError) as first_answer:
            await submitted
        assert first_answer.value.code == "unavailable"
        await assert_placed(second, spec, "given-1")  # its id free again, and placed
    finally:
        fail_now.set()
        go_on.set()
        with contextlib.suppress(BaseException):
            await submitted
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)


async def test_an_adoption_cut_short_lets_the_lease_lapse_to_be_adopted_again(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The adopter took the lease, then reading the pipeline's record failed (the server
    going away; here one injected into the read): it lets the lease lapse, and adopts the
    pipeline again. Before, it held the lease for ever with no run behind it: nobody drove
    the pipeline, and other replicas answered `status` from its last record."""
    first, agents = await start_cluster(nats_url, configs())
    second = Orchestrator(nats_url, name="second")
    await second.start()
    tap = EventTap()
    record = second.failover.runs.record
    failed: list[str] = []

    async def first_read_fails(pid: str) -> Any:
        if not failed:
            failed.append(pid)
            raise nats.errors.TimeoutError
        return await record(pid)

    monkeypatch.setattr(second.failover.runs, "record", first_read_fails)
    try:
        assert await second.wait_for_agents(2, 10.0) == 2
        await tap.start(nats_url, "cut-1")
        await first.submit_spec(chain("cut", [0.2, 2.0, 0.3]), "cut-1")
        await tap.wait("t1", "started")
        first.failover.suspend()  # frozen or partitioned: it stops renewing
        await second.wait_for(lambda: "cut-1" in second.pipelines, 30.0)
        assert failed == ["cut-1"]  # the first adoption was cut short
        run = await second.wait_terminal("cut-1", 30.0)
        assert run.state == "succeeded", run.reason
        rec = await settled_record(nats_url, "cut-1")
        assert rec.owner == "second" and rec.epoch == 3  # taken twice
    finally:
        await tap.close()
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)


async def test_events_fenced_while_the_lease_lapsed_are_applied_once_it_is_renewed(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back from an outage, a replica reads its pipelines' task events again at once, while
    some of their leases have not been renewed yet: those events are fenced (not applied),
    and must be read again once the lease is renewed. Before, that first read moved the
    pipeline's replay mark past them, so the read after the renewal started after them too:
    the pipeline never heard its last tasks end and ran for ever (what the 15 s server
    outage stress showed when owners, not adopters, resumed their lapsed pipelines)."""
    orch, agents = await start_cluster(nats_url, configs(1))
    leases = orch.failover.leases
    renewing = hold_renewals(orch, monkeypatch)  # the server away: no renewal gets through
    tap = EventTap()
    try:
        await tap.start(nats_url, "gap-1")
        reply = await orch.submit_spec(chain("gap", [0.05, 0.3]), "gap-1")
        assert reply.state == "running"
        leases.held["gap-1"].valid_until = orch.mono()  # lapsed: every event from now fenced
        await tap.wait("t1", "succeeded")
        assert await agents[0].outbox.wait_empty(10.0)  # every event is on the stream
        await orch.failover.catch_up("gap-1")  # as after a reconnect, the lease still lapsed
        run = orch.pipelines["gap-1"]
        assert not run.terminal  # fenced
        renewing.set()  # renewed: caught up again, this time applied
        run = await orch.wait_terminal("gap-1", 10.0)
        assert run.state == "succeeded", run.reason
    finally:
        renewing.set()
        await tap.close()
        await stop_cluster(orch, agents)


async def test_a_pipeline_ended_unrecorded_is_kept_until_its_end_is_written(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline that ends while its lease has lapsed (the server away) cannot record its
    end until the lease is renewed; meanwhile newer pipelines make the replica drop finished
    ones from memory. Before, this one was dropped too: once the lease was renewed nothing
    was left to write the end from, the lease was renewed for ever and the record said
    running for ever (found by the 15 s server-outage stress: "not terminal 120 s after
    submit")."""
    orch, agents = await start_cluster(nats_url, configs(1))
    leases = orch.failover.leases
    renewing = hold_renewals(orch, monkeypatch)  # the server away: no renewal gets through
    try:
        await orch.submit_spec(chain("kept", [5.0]), "kept-1")
        leases.held["kept-1"].valid_until = orch.mono()  # lapsed
        await orch.queries.cancel(CancelRequest(pipeline_id="kept-1", reason="ended while lapsed"))
        assert not orch.failover.end_recorded("kept-1")
        await orch.submit_spec(chain("newer", [0.05]), "newer-1")
        await orch.wait_terminal("newer-1", 10.0)
        orch.forget_finished(keep=0)  # every finished pipeline dropped from memory...
        assert "newer-1" not in orch.pipelines
        assert "kept-1" in orch.pipelines  # ...but one whose end is not written yet
        renewing.set()
        rec = await settled_record(nats_url, "kept-1")
        assert rec.state == "cancelled"
        await kv_until(nats_url, OWNERS_BUCKET, "kept-1", OwnerLease, lambda x: not x.expires, 5)
    finally:
        renewing.set()
        await stop_cluster(orch, agents)


async def test_a_lapsed_replica_answers_from_its_copy_when_jetstream_does_not(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its lease lapsed (the server away), it asks the record and the lease who holds the
    pipeline now; when neither answers, it says what it knows (and cancels what it holds)
    rather than fail the request."""
    orch, agents = await start_cluster(nats_url, configs(1))
    try:
        await orch.submit_spec(chain("cut", [5.0]), "cut-1")
        orch.failover.leases.held["cut-1"].valid_until = orch.mono()  # lapsed

        async def unanswered(pid: str) -> None:
            raise TimeoutError

        monkeypatch.setattr(orch.failover, "status_elsewhere", unanswered)
        monkeypatch.setattr(orch.failover, "holder", unanswered)
        st = await orch.status_of("cut-1")
        assert st.state == "running" and st.owner == orch.owner
        with pytest.raises(TimeoutError):  # one it knows nothing of: said as such
            await orch.status_of("elsewhere-1")
        # a cancel too is served here (its end written once the lease is renewed)
        got = await orch.queries.cancel(CancelRequest(pipeline_id="cut-1", reason="cut off"))
        assert got.state == "cancelled" and orch.pipelines["cut-1"].state == "cancelled"
    finally:
        await stop_cluster(orch, agents)


async def test_a_recovery_its_owner_could_not_act_on_waits_for_its_lease(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task's agent dies while its owner's lease has lapsed here (renewals held back: the
    server away for it) and is still its own: the re-placement waits for the lease and is
    retried, not dropped. Dropped, nothing asked again, and the pipeline waited on a dead
    agent (booking_stress, a fleet restarted during a server outage)."""
    orch, agents = await start_cluster(nats_url, configs(2))
    renewing = hold_renewals(orch, monkeypatch)
    try:
        spec = PipelineSpec.model_validate(
            {"name": "w", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 5.0}}]}
        )
        await orch.submit_spec(spec, "wait-1")
        run = orch.pipelines["wait-1"]
        await orch.wait_for(lambda: run.tasks["t"].state == "started", 10.0)
        doomed = next(a for a in agents if a.agent_id == run.tasks["t"].agent_id)
        orch.failover.leases.held["wait-1"].valid_until = orch.mono()  # lapsed here
        assert orch.failover.holds("wait-1") and not orch.failover.may_act("wait-1")
        await doomed.stop()
        await orch.wait_for(lambda: orch.recovery.put_off("wait-1"), 10.0)
        assert any("lease on it lapsed" in x for x in run.placement_log), run.placement_log
        assert run.tasks["t"].agent_id == doomed.agent_id  # not moved while it may not act
        renewing.set()
        done = await orch.wait_terminal("wait-1", 30.0)
        assert done.state == "succeeded", done.reason
        assert done.tasks["t"].agent_id != doomed.agent_id and done.recoveries == 1
    finally:
        renewing.set()
        await stop_cluster(orch, agents)
