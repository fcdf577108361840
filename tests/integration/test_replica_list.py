"""`list` answers with every replica's pipelines, whichever replica the queue group gives it
to, over a real nats-server: each holds its own in memory and is asked for them."""

from __future__ import annotations

import contextlib

import pytest

from orchestrator.client import Client
from orchestrator.service import Orchestrator
from schemas.api import CancelRequest, ListRequest
from tests.harness import start_cluster, stop_cluster
from tests.integration.test_failover import chain, configs

pytestmark = pytest.mark.integration


def ids(reply: object) -> list[str]:
    return [p.pipeline_id for p in reply.pipelines]  # type: ignore[attr-defined]


async def test_list_answers_with_every_replicas_pipelines(nats_url: str) -> None:
    first, agents = await start_cluster(nats_url, configs(1), name="orch-first")
    second = Orchestrator(nats_url, name="orch-second")
    await second.start()
    client = await Client.connect(nats_url)
    try:
        await first.replicas.wait_until(lambda: first.replicas.up() == ["orch-second"], 10.0)
        await second.replicas.wait_until(lambda: second.replicas.up() == ["orch-first"], 10.0)
        assert await second.wait_for_agents(1, 10.0) == 1
        await first.submit_spec(chain("old", [30.0]), "old-1")
        await second.submit_spec(chain("new", [30.0]), "new-1")
        await first.cancel(CancelRequest(pipeline_id="old-1"))
        for orch in (first, second):  # each holds one, and lists both, newest first
            got = await orch.list(ListRequest())
            assert ids(got) == ["new-1", "old-1"] and got.unanswered == []
            assert [p.state for p in got.pipelines] == ["running", "cancelled"]
            assert ids(await orch.list(ListRequest(state="cancelled"))) == ["old-1"]
            assert ids(await orch.list(ListRequest(limit=1))) == ["new-1"]
        for _ in range(4):  # through the queue group, whichever replica answers
            assert ids(await client.list()) == ["new-1", "old-1"]
        # a replica heard from lately that does not answer (crashed since): said, not hidden
        first.list_wait_s = 0.5
        first.replicas.heard["orch-gone"] = first.mono()
        got = await first.list(ListRequest())
        assert ids(got) == ["new-1", "old-1"] and got.unanswered == ["orch-gone"]
        del first.replicas.heard["orch-gone"]
        # one that stops says goodbye, and is asked no more
        await second.stop()
        await first.replicas.wait_until(lambda: first.replicas.up() == [], 10.0)
        assert (await first.list(ListRequest())).unanswered == []
    finally:
        await client.close()
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)
