"""A first placement's offers travel while its bookings are written (token 0, "provisional");
each task still runs only under the fencing token its booking produced, which the commit
brings. Over a real nats-server, with the messages read off the wire by a second client."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from orchestrator.reservations.store import BookingStore, device_key
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import decode, encoding_of
from schemas.placement import CancelCommand, CommitCommand, OfferBatch, TaskOffer
from tests.harness import agent_config, start_cluster, stop_cluster
from transport.rpc import settle

pytestmark = pytest.mark.integration


def pipeline(name: str, tasks: list[dict[str, Any]]) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": name, "tasks": tasks})


def sleep_task(tid: str, seconds: float, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "run": {"kind": "synthetic", "seconds": seconds}, **kw}


class Wire:
    """Offers, commits and cancels as the agents receive them, in arrival order."""

    def __init__(self) -> None:
        self.offers: list[TaskOffer] = []
        self.commits: list[CommitCommand] = []
        self.cancels: list[CancelCommand] = []

    async def listen(self, nc: Any) -> None:
        async def on_offer(msg: Any) -> None:
            self.offers.append(decode(msg.data, TaskOffer, encoding_of(msg.headers)))

        async def on_offers(msg: Any) -> None:
            self.offers.extend(decode(msg.data, OfferBatch, encoding_of(msg.headers)).offers)

        async def on_commit(msg: Any) -> None:
            self.commits.append(decode(msg.data, CommitCommand, encoding_of(msg.headers)))

        async def on_cancel(msg: Any) -> None:
            self.cancels.append(decode(msg.data, CancelCommand, encoding_of(msg.headers)))

        await nc.subscribe(subjects.offer("*"), cb=on_offer)
        await nc.subscribe(subjects.offers("*"), cb=on_offers)
        await nc.subscribe(subjects.commit("*"), cb=on_commit)
        await nc.subscribe(subjects.cancel("*"), cb=on_cancel)
        await settle(nc)

    def committed_tokens(self, pid: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.commits:
            if c.pipeline_id == pid:
                out.update(c.token_of())
        return out


@contextlib.asynccontextmanager
async def losing_first_cas(nats_url: str) -> AsyncIterator[tuple[Orchestrator, list[Any], Wire]]:
    """One agent (a, one cpu slot), the wire read, and the orchestrator planning on a view that
    misses the window another store books next on a's cpu0: its first CAS there must lose,
    whatever the timing, and its next round books (and offers) after reading the key again."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=1)})
    nc = await nats.connect(nats_url)
    wire = Wire()
    await wire.listen(nc)
    other = BookingStore(nc.jetstream())
    await other.start()
    try:
        await orch.store.stop()
        now = time.time()
        foreign = BookingWindow(
            pipeline_id="foreign", task_id="f", slot=0, start=now, end=now + 0.3,
            expires=now + 30, owner="another-replica",
        )  # fmt: skip
        assert (await other.book(device_key("a", "cpu0"), [foreign], now)).ok
        yield orch, agents, wire
        await settle(nc)  # every message sent is read off the wire
    finally:
        await other.stop()
        await nc.close()
        await stop_cluster(orch, agents)


async def test_first_offers_are_provisional_and_tasks_run_under_their_booking_tokens(
    nats_url: str,
) -> None:
    configs = {name: agent_config("s", "edge", cpu_slots=1) for name in ("a", "b")}
    orch, agents = await start_cluster(nats_url, configs)
    nc = await nats.connect(nats_url)
    wire = Wire()
    await wire.listen(nc)
    try:
        tasks = [sleep_task("x", 0.02), sleep_task("y", 0.02), sleep_task("z", 0.02, deps=["x"])]
        reply = await orch.submit_spec(pipeline("prov", tasks), "prov-1")
        assert reply.state == "running"
        run = await orch.wait_terminal("prov-1", 20)
        assert run.state == "succeeded", run.reason
        assert run.conflicts == 0 and run.rejections == 0 and run.stale_events == 0
        await settle(nc)
        offers = [x for x in wire.offers if x.pipeline_id == "prov-1"]
        assert sorted(x.task.id for x in offers) == ["x", "y", "z"]  # one round, no re-sends
        assert all(x.token == 0 for x in offers)
        tokens = {t: tr.token for t, tr in run.tasks.items()}
        assert all(tok > 0 for tok in tokens.values())
        assert wire.committed_tokens("prov-1") == tokens
        # each token is the revision of the booking that holds the task's window
        kv = await nc.jetstream().key_value("MARS_BOOKINGS")
        for tid, tr in run.tasks.items():
            entry = await kv.get(device_key(tr.agent_id or "", tr.device_id or ""), tokens[tid])
            book = decode(entry.value or b"", DeviceBookings)
            assert any(w.pipeline_id == "prov-1" and w.task_id == tid for w in book.windows)
        ran = [(p, t) for a in agents for (p, t, *_rest) in a.log if p == "prov-1"]
        assert sorted(ran) == [("prov-1", "x"), ("prov-1", "y"), ("prov-1", "z")]  # once each
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_first_round_conflict_withdraws_the_provisional_offer(nats_url: str) -> None:
    async with losing_first_cas(nats_url) as (orch, agents, wire):
        reply = await orch.submit_spec(pipeline("late", [sleep_task("t", 0.01)]), "late-1")
        assert reply.state == "running"
        run = await orch.wait_terminal("late-1", 20)
        assert run.state == "succeeded", run.reason
        assert run.conflicts == 1
        assert any("conflict on dev.a.cpu0 with foreign/f" in x for x in run.placement_log)
    first, second = [x for x in wire.offers if x.pipeline_id == "late-1"]
    assert first.token == 0  # offered while the (losing) booking was written
    assert second.token == run.tasks["t"].token > 0  # booked first, then offered
    withdrawn = [c for c in wire.cancels if c.pipeline_id == "late-1"]
    assert [(c.task_ids, c.max_token) for c in withdrawn] == [(["t"], 0)]
    assert wire.committed_tokens("late-1") == {"t": second.token}
    assert [e[1] for e in agents[0].log if e[0] == "late-1"] == ["t"]  # ran once


async def test_an_offer_made_after_booking_names_its_producers_tokens(nats_url: str) -> None:
    """A consumer offered after its round's bookings (any round but a first placement's
    first) names the token of each producer's placement, so its agent refuses an output of
    an older one; a provisional offer names none (0: not known yet)."""
    async with losing_first_cas(nats_url) as (orch, _agents, wire):
        tasks = [sleep_task("t", 0.01), sleep_task("u", 0.01, deps=["t"])]
        assert (await orch.submit_spec(pipeline("fed", tasks), "fed-1")).state == "running"
        run = await orch.wait_terminal("fed-1", 20)
        assert run.state == "succeeded", run.reason
    u = [x for x in wire.offers if x.pipeline_id == "fed-1" and x.task.id == "u"]
    assert [x.token for x in u[:1]] == [0] and u[0].inputs[0].token == 0  # provisional
    last = u[-1]
    assert last.token == run.tasks["u"].token > 0
    assert [(i.task_id, i.token) for i in last.inputs] == [("t", run.tasks["t"].token)]
    assert run.tasks["t"].token > 0


async def test_a_new_pipeline_s_messages_leave_in_the_order_that_pays(nats_url: str) -> None:
    """Read off the wire by a second client (NATS keeps one publisher's order for each
    subscriber): the ownership claim, then the offers (an agent's answer is the longer round
    trip), then the CAS bookings; the reply before the commits and the pipeline's record, and
    after its spec (begun once the claim is won: an adopter that finds the spec and no record
    knows the pipeline was answered). The client's submit and the offers travel as JSON."""
    from orchestrator.reservations.store import BUCKET
    from schemas.failover import OWNERS_BUCKET, RUNS_BUCKET
    from transport.client import Client

    configs = {name: agent_config("s", "edge", cpu_slots=1) for name in ("a", "b")}
    orch, agents = await start_cluster(nats_url, configs)
    mon = await nats.connect(nats_url)
    cnc = await nats.connect(nats_url, inbox_prefix="clientbox")
    seen: list[tuple[str, str]] = []

    async def note(msg: Any) -> None:
        seen.append((msg.subject, (msg.headers or {}).get("Content-Type", "")))

    kinds = {
        "claim": [f"$KV.{OWNERS_BUCKET}.>"], "offer": [subjects.offers("*"), subjects.offer("*")],
        "book": [f"$KV.{BUCKET}.>"], "commit": [subjects.commit("*")],
        "record": [f"$KV.{RUNS_BUCKET}.run.>"], "spec": [f"$KV.{RUNS_BUCKET}.spec.>"],
        "reply": ["clientbox.>"], "submit": [subjects.SUBMIT],
    }  # fmt: skip
    try:
        for patterns in kinds.values():
            for subject in patterns:
                await mon.subscribe(subject, cb=note)
        await settle(mon)
        tasks = [sleep_task("x", 0.01), sleep_task("y", 0.01), sleep_task("z", 0.01, deps=["x"])]
        reply = await Client(cnc).submit(pipeline("order", tasks), "order-1")
        assert reply.state == "running"
        run = await orch.wait_terminal("order-1", 20)
        assert run.state == "succeeded", run.reason
        await settle(mon)

        def matches(pattern: str, subject: str) -> bool:
            want, parts = pattern.split("."), subject.split(".")
            if want[-1] == ">":
                return parts[: len(want) - 1] == want[:-1]
            return len(parts) == len(want) and all(
                w in ("*", x) for w, x in zip(want, parts, strict=True)
            )

        def first(kind: str) -> int:
            return next(
                i for i, (subject, _) in enumerate(seen)
                if any(matches(p, subject) for p in kinds[kind])
            )  # fmt: skip

        assert first("submit") < first("claim") < first("offer") < first("book")
        assert first("reply") < first("commit") and first("reply") < first("record")
        assert first("claim") < first("spec") < first("reply")
        json = "application/json"
        assert seen[first("submit")][1] == json and seen[first("offer")][1] == json
        assert seen[first("commit")][1] == json
    finally:
        await cnc.close()
        await mon.close()
        await stop_cluster(orch, agents)
