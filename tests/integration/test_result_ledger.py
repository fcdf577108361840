"""The result ledger over a real nats-server: first commit wins, later ones say why not,
commits gathered together cost one write per key, and `revisions` sees every value a task's
result ever had in the bucket (the exactly-once audit)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg

from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.reliability.results import CHUNK, ResultLedger, result_key, revisions
from schemas.codec import decode, encode
from schemas.events import TaskEvent
from schemas.recovery import TaskResult, TaskResults
from transport.rpc import settle

pytestmark = pytest.mark.integration


def succeeded(task: str, token: int, event: str, pipeline: str = "p1") -> TaskEvent:
    return TaskEvent(
        event_id=event, pipeline_id=pipeline, task_id=task, agent_id="a1", incarnation="i1",
        device_id="cpu0", token=token, state="succeeded", duration_s=0.01,
    )  # fmt: skip


async def test_first_commit_wins_and_revisions_sees_every_value(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        ledger = ResultLedger(js, "orch-1")
        await ledger.start()
        assert await revisions(js, "p1") == {}
        # gathered, then written together: one write, and a repeat in the same batch is seen
        first = [ledger.ask(succeeded("a", 3, "e1"), 0), ledger.ask(succeeded("a", 3, "e1"), 0)]
        first.append(ledger.ask(succeeded("b", 1, "e3"), 1))
        await ledger.flush("p1")
        assert [f.result() for f in first] == ["committed", "duplicate", "committed"]
        assert ledger.writes == 1
        # later commits of a task say why they were not written
        later = [ledger.ask(succeeded("a", 2, "e0"), 0), ledger.ask(succeeded("a", 4, "e2"), 0)]
        await ledger.flush("p1")
        assert [f.result() for f in later] == ["stale", "rerun"] and ledger.writes == 1
        # a task further on in a large pipeline goes to the next key
        assert result_key("p1", CHUNK) == "p1.1" != result_key("p1", CHUNK - 1)
        far = ledger.ask(succeeded("z", 1, "e5"), CHUNK)
        await ledger.flush("p1")
        assert far.result() == "committed"
        chunk = decode((await ledger.kv.get("p1.1")).value, TaskResults)
        assert [r.task_id for r in chunk.results] == ["z"]
        # one not flushed is written BATCH_S later by itself
        alone = ledger.ask(succeeded("x", 1, "e4", "p2"), 0)
        assert await asyncio.wait_for(alone, 5.0) == "committed"
        got = await revisions(js, "p1")
        assert {t: [r.event_id for r in rs] for t, rs in got.items()} == {
            "a": ["e1"], "b": ["e3"], "z": ["e5"]
        }  # fmt: skip
        # a value changed in place (what exactly-once forbids) is seen, oldest first
        cur = decode((await ledger.kv.get("p1.0")).value, TaskResults)
        forced = TaskResult.of(succeeded("b", 9, "e9"), "intruder")
        bad = [r if r.task_id != "b" else forced for r in cur.results]
        await ledger.kv.put("p1.0", encode(TaskResults(pipeline_id="p1", results=bad)))
        again = await revisions(js, "p1")
        assert [r.event_id for r in again["b"]] == ["e3", "e9"] and len(again["a"]) == 1
        assert list(await revisions(js, "p2")) == ["x"]
    finally:
        await nc.close()


async def test_two_ledgers_add_to_one_key_without_losing_either(nats_url: str) -> None:
    """Replicas committing results of one pipeline (an adopter replaying its events): the
    second to write reads what the first wrote and adds to it, by CAS."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        one, two = ResultLedger(js, "orch-1"), ResultLedger(js, "orch-2")
        await one.start()
        await two.start()
        mine = one.ask(succeeded("a", 1, "e1"), 0)
        await one.flush("p1")
        # `two` has not read the key: its write loses the CAS, reads, and adds to it
        theirs = [two.ask(succeeded("a", 1, "e1"), 0), two.ask(succeeded("b", 1, "e2"), 1)]
        await two.flush("p1")
        assert mine.result() == "committed"
        assert [f.result() for f in theirs] == ["duplicate", "committed"]
        # and `one`, whose copy of the key is now old, does the same
        late = one.ask(succeeded("c", 1, "e3"), 2)
        await one.flush("p1")
        assert late.result() == "committed"
        got = await revisions(js, "p1")
        assert {t: [r.committed_by for r in rs] for t, rs in got.items()} == {
            "a": ["orch-1"], "b": ["orch-2"], "c": ["orch-1"]
        }  # fmt: skip
    finally:
        await nc.close()


async def test_a_new_key_is_created_without_a_read_and_an_existing_one_read_once(
    nats_url: str,
) -> None:
    """A replica's own pipeline's chunk does not exist yet: its first write creates it with no
    read before it. A chunk that does exist (another replica wrote it) fails that create and
    is read then, and its results are kept."""
    nc = await nats.connect(nats_url)
    reads: list[str] = []

    async def tap(msg: Msg) -> None:
        reads.append(msg.subject)

    try:
        sub = await nc.subscribe("$JS.API.STREAM.MSG.GET.>", cb=tap)
        await settle(nc)  # the tap is live before anything is asked
        js = nc.jetstream()
        one, two = ResultLedger(js, "orch-1"), ResultLedger(js, "orch-2")
        await one.start()
        await two.start()
        first = one.ask(succeeded("a", 1, "e1", "p9"), 0)
        await one.flush("p9")
        assert first.result() == "committed" and one.writes == 1
        await settle(nc)  # our tap has heard whatever the server was asked before this
        assert reads == []
        second = two.ask(succeeded("b", 1, "e2", "p9"), 1)
        await two.flush("p9")
        assert second.result() == "committed" and two.writes == 1
        await settle(nc)
        assert len(reads) == 1
        got = await revisions(js, "p9")
        assert {t: [r.committed_by for r in rs] for t, rs in got.items()} == {
            "a": ["orch-1"], "b": ["orch-2"]
        }  # fmt: skip
        await sub.unsubscribe()
    finally:
        await nc.close()


async def test_two_batches_of_one_key_are_written_in_turn_not_raced(nats_url: str) -> None:
    """A batch falling due while the pipeline's end writes the next one (two flushes of one
    key at once): the second is written after the first, on its revision, with no CAS lost
    and nothing read back."""
    nc = await nats.connect(nats_url)
    reads: list[str] = []

    async def tap(msg: Msg) -> None:
        reads.append(msg.subject)

    try:
        await nc.subscribe("$JS.API.STREAM.MSG.GET.>", cb=tap)
        await settle(nc)
        ledger = ResultLedger(nc.jetstream(), "orch-1")
        await ledger.start()
        first = ledger.ask(succeeded("a", 1, "e1", "p8"), 0)
        one = asyncio.ensure_future(ledger.flush("p8"))
        await asyncio.sleep(0)  # it takes its batch and sends its write (one loop turn)
        second = ledger.ask(succeeded("b", 1, "e2", "p8"), 1)
        await asyncio.gather(one, ledger.flush("p8"))
        assert [first.result(), second.result()] == ["committed", "committed"]
        assert ledger.writes == 2
        await settle(nc)
        assert reads == []
        got = await revisions(nc.jetstream(), "p8")
        assert sorted(got) == ["a", "b"]
    finally:
        await nc.close()


async def test_a_commit_due_while_the_server_is_away_is_written_once_it_is_back(
    nats_server: EmbeddedNats,
) -> None:
    """A batch falls due while the server restarts: its write fails (here: times out), and is
    tried again until the server is back, not given up (its pipeline ended succeeded with the
    result never committed)."""
    nc = await nats.connect(nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        ledger = ResultLedger(nc.jetstream(timeout=0.5), "orch-1")
        await ledger.start()
        await asyncio.to_thread(nats_server.stop)
        asked = ledger.ask(succeeded("a", 3, "e1"), 0)
        writing = asyncio.create_task(ledger.flush("p1"))
        await ledger.wait_until(lambda: ledger.retries >= 1, 10.0)  # failed: server away
        assert not asked.done()
        await asyncio.to_thread(nats_server.start)
        assert await asyncio.wait_for(asked, 15.0) == "committed"
        await writing
        assert ledger.retries >= 1
        got = await revisions(nc.jetstream(), "p1")
        assert {t: [r.token for r in rs] for t, rs in got.items()} == {"a": [3]}
    finally:
        await nc.close()
