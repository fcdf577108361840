"""`list` answers with every replica's pipelines, whichever replica the queue group gives it
to, over a real nats-server: each holds its own in memory and is asked for them. And a
replica serves its API requests side by side."""

from __future__ import annotations

import asyncio

import pytest

from schemas.api import CancelRequest, ListReply, ListRequest, StatusReply
from schemas.codec import RemoteError
from tests.harness import start_cluster, stop_cluster, two_replicas
from tests.integration.test_failover import chain, configs
from transport.client import Client

pytestmark = pytest.mark.integration


def ids(reply: ListReply) -> list[str]:
    return [p.pipeline_id for p in reply.pipelines]


async def test_list_answers_with_every_replicas_pipelines(nats_url: str) -> None:
    """Each replica holds its own pipelines and lists both, newest first; through the queue
    group too; a replica heard lately that does not answer is named; one gone is not asked."""
    client = await Client.connect(nats_url)
    try:
        async with two_replicas(nats_url, configs(1), "orch-first", "orch-second") as (
            first, second, _agents,
        ):  # fmt: skip
            await first.replicas.wait_until(lambda: first.replicas.up() == ["orch-second"], 10.0)
            await second.replicas.wait_until(lambda: second.replicas.up() == ["orch-first"], 10.0)
            assert await second.wait_for_agents(1, 10.0) == 1
            await first.submit_spec(chain("old", [30.0]), "old-1")
            await second.submit_spec(chain("new", [30.0]), "new-1")
            await first.queries.cancel(CancelRequest(pipeline_id="old-1"))
            for orch in (first, second):  # each holds one, and lists both, newest first
                got = await orch.queries.list(ListRequest())
                assert ids(got) == ["new-1", "old-1"] and got.unanswered == []
                assert [p.state for p in got.pipelines] == ["running", "cancelled"]
                assert [p.owner for p in got.pipelines] == ["orch-second", "orch-first"]
                assert ids(await orch.queries.list(ListRequest(state="cancelled"))) == ["old-1"]
                assert ids(await orch.queries.list(ListRequest(limit=1))) == ["new-1"]
            for _ in range(4):  # through the queue group, whichever replica answers
                assert ids(await client.list()) == ["new-1", "old-1"]
            # a replica heard from lately that does not answer (crashed since): said, not hidden
            first.queries.list_wait_s = 0.5
            first.replicas.heard["orch-gone"] = first.mono()
            got = await first.queries.list(ListRequest())
            assert ids(got) == ["new-1", "old-1"] and got.unanswered == ["orch-gone"]
            del first.replicas.heard["orch-gone"]
            # one that stops says goodbye, and is asked no more
            await second.stop()
            await first.replicas.wait_until(lambda: first.replicas.up() == [], 10.0)
            assert (await first.queries.list(ListRequest())).unanswered == []
    finally:
        await client.close()


async def test_a_request_waiting_on_jetstream_holds_up_no_other(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status answered from the record waits on JetStream (seconds while a restarted server
    comes back): the next status, about a pipeline held here, is answered meanwhile. Before,
    a replica served one API request at a time, and after a long outage every status behind
    a slow one timed out in turn."""
    orch, agents = await start_cluster(nats_url, configs(1), name="orch-only")
    client = await Client.connect(nats_url, timeout=3.0)
    release = asyncio.Event()
    asked = asyncio.Event()
    status_elsewhere = orch.failover.status_elsewhere

    async def slow(pid: str) -> StatusReply | None:
        asked.set()
        await release.wait()  # JetStream not answering yet
        return await status_elsewhere(pid)

    monkeypatch.setattr(orch.failover, "status_elsewhere", slow)
    try:
        await orch.submit_spec(chain("here", [30.0]), "here-1")
        waiting = asyncio.create_task(client.status("elsewhere-1"))
        await asyncio.wait_for(asked.wait(), 5.0)
        assert (await client.status("here-1")).state == "running"  # not held up
        assert not waiting.done()
        release.set()
        with pytest.raises(RemoteError) as nf:
            await waiting
        assert nf.value.code == "not_found"
    finally:
        release.set()
        await client.close()
        await stop_cluster(orch, agents)
