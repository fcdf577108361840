"""Peers of the release before wire levels, over a real nats-server: the orchestrator sends
them only what they read (the level-1 messages themselves are read by that release's own
models in tests/unit/test_wire_levels.py)."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import nats
from nats.aio.msg import Msg

from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.codec import encode, headers_for
from schemas.placement import FetchRequest
from schemas.wire import WIRE_HEADER, WIRE_LEVEL
from tests.harness import RecordingAgent, agent_config, start_cluster, stop_cluster
from transport.client import Client


class LevelOneAgent(RecordingAgent):
    """An agent that sends its adverts as a release before wire levels did: without the
    level header. Emulated: in everything else it is this release's agent."""

    async def _publish_advert(self) -> None:
        assert self.nc is not None
        await self.nc.publish(subjects.advert(self.agent_id), encode(self.advert()))


async def test_an_agent_of_the_release_before_levels_gets_offers_it_reads(nats_url: str) -> None:
    """ "c" (on the old agent) and "q" (on a current one) take "p"'s output: c's offer names
    no producer token for its input, which the old agent's closed models would refuse; q's
    does. The pipeline runs."""
    orch = Orchestrator(nats_url)
    await orch.start()
    agents = [
        RecordingAgent(nats_url, agent_config("s", "edge"), agent_id="new", calibrate=False),
        LevelOneAgent(nats_url, agent_config("s", "edge"), agent_id="old", calibrate=False),
    ]
    nc = await nats.connect(nats_url)
    seen: dict[str, list[dict[str, Any]]] = {"new": [], "old": []}
    try:
        for a in agents:
            await a.start()
        assert await orch.wait_for_agents(2, timeout=10.0) == 2
        assert {aid: e.wire for aid, e in orch.view.agents.items()} == {"new": WIRE_LEVEL, "old": 1}
        # `mars agents` says which agents are still to upgrade
        listed = {a.agent_id: a.wire for a in (await Client(nc).agents()).agents}
        assert listed == {"new": WIRE_LEVEL, "old": 1}
        for aid in seen:

            async def note(msg: Msg, aid: str = aid) -> None:
                body = json.loads(msg.data)
                seen[aid].extend(body.get("offers", [body]))

            await nc.subscribe(subjects.offer(aid), cb=note)
            await nc.subscribe(subjects.offers(aid), cb=note)
        await nc.flush()
        spec = PipelineSpec.model_validate({"name": "two", "tasks": [
            {"id": "p", "run": {"kind": "synthetic", "seconds": 0.05},
             "requires": {"pinned_agent": "new"}},
            {"id": "c", "run": {"kind": "synthetic", "seconds": 0.05}, "deps": ["p"],
             "requires": {"pinned_agent": "old"}},
            {"id": "q", "run": {"kind": "synthetic", "seconds": 0.05}, "deps": ["p"],
             "requires": {"pinned_agent": "new"}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "two")
        run = await orch.wait_terminal("two", 15.0)
        assert run.state == "succeeded", run.reason
        await nc.flush()  # the copies of the offers have reached this connection
        old = [o for o in seen["old"] if o["task"]["id"] == "c"]
        new = [o for o in seen["new"] if o["task"]["id"] == "q"]
        assert old and new, seen
        untokened = [i["task_id"] for o in old for i in o["inputs"] if "token" not in i]
        tokened = [i["task_id"] for o in new for i in o["inputs"] if "token" in i]
        assert untokened == ["p"] * len(old) and tokened == ["p"] * len(new)
        assert all("timeout_s" not in o["task"]["run"] for o in old)
        assert run.tasks["c"].agent_id == "old"
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_client_of_the_release_before_levels_gets_replies_it_reads(nats_url: str) -> None:
    """A request without the level header (an older `mars`) is answered without the fields
    added since; with it, in full."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge")})
    nc = await nats.connect(nats_url)
    try:
        spec = PipelineSpec.model_validate(
            {"name": "one", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
        )
        await orch.submit_spec(spec, "one")
        body = msgpack.packb({}, use_bin_type=True)
        old = await nc.request(subjects.LIST, body, timeout=5.0)
        new = await nc.request(subjects.LIST, body, timeout=5.0, headers={WIRE_HEADER: "2"})
        old_reply, new_reply = (msgpack.unpackb(m.data, raw=False) for m in (old, new))
        assert "unanswered" not in old_reply and "unanswered" in new_reply
        (o,), (n,) = old_reply["pipelines"], new_reply["pipelines"]
        assert o["pipeline_id"] == n["pipeline_id"] == "one"
        assert not {"submitted", "owner"} & set(o) and n["owner"] == orch.owner
        assert old.headers is not None and old.headers[WIRE_HEADER] == str(WIRE_LEVEL)
    finally:
        await nc.close()
        await stop_cluster(orch, agents)


async def test_a_producers_agent_sends_an_older_consumers_agent_transfers_it_reads(
    nats_url: str,
) -> None:
    """A python task returns a dict, undeclared: its output goes to "c" on the old agent
    without its media type (that agent's closed models would refuse the whole transfer), and
    to "q" on a current one with it. A fetch by a requester of an older level is answered so
    too."""
    cpu = [{"device_id": "cpu0", "kind": "cpu", "gflops": 100.0, "emulated": True}]
    py = {"allowed_kinds": ["synthetic", "python"], "python_allow": ["edge_agent.builtin_tasks"]}
    orch = Orchestrator(nats_url)
    await orch.start()
    agents = [
        RecordingAgent(nats_url, agent_config("s", "edge", probe_cpu=False, devices=cpu, **py),
                       agent_id="new", calibrate=False),
        RecordingAgent(nats_url, agent_config("s", "edge"), agent_id="new2", calibrate=False),
        LevelOneAgent(nats_url, agent_config("s", "edge"), agent_id="old", calibrate=False),
    ]  # fmt: skip
    nc = await nats.connect(nats_url)
    sent: dict[str, list[dict[str, Any]]] = {"new2": [], "old": []}
    try:
        for a in agents:
            await a.start()
        assert await orch.wait_for_agents(3, timeout=10.0) == 3
        for aid in sent:

            async def note(msg: Msg, aid: str = aid) -> None:
                sent[aid].append(msgpack.unpackb(msg.data, raw=False))

            # the old agent is pushed to on the subject of its level, naming no sender
            where = subjects.data(aid) if aid == "old" else subjects.data_from(aid, "new")
            await nc.subscribe(where, cb=note)
        await nc.flush()
        syn = {"kind": "synthetic", "seconds": 0.01}
        spec = PipelineSpec.model_validate({"name": "typed", "tasks": [
            {"id": "p", "run": {"kind": "python", "entry": "edge_agent.builtin_tasks:describe",
                                "kwargs": {"a": 1}}, "requires": {"pinned_agent": "new"}},
            {"id": "c", "run": syn, "deps": ["p"], "requires": {"pinned_agent": "old"}},
            {"id": "q", "run": syn, "deps": ["p"], "requires": {"pinned_agent": "new2"}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "typed")
        run = await orch.wait_terminal("typed", 15.0)
        assert run.state == "succeeded", run.reason
        await nc.flush()
        assert sent["old"] and sent["new2"], sent
        assert all("media_type" not in t for t in sent["old"]), sent["old"]
        assert all(t["media_type"] == "application/json" for t in sent["new2"]), sent["new2"]
        # asked for it again by a requester without the level header (the release before
        # levels), and by one of this release
        ask = FetchRequest(pipeline_id="typed", producer="p", consumer="q", agent_id="new2")
        replies = [
            msgpack.unpackb((await nc.request(subjects.fetch("new"), encode(ask), timeout=5.0,
                                              headers=h)).data, raw=False)
            for h in (None, headers_for("msgpack"))
        ]  # fmt: skip
        assert "media_type" not in replies[0] and "data" in replies[0], replies[0]
        assert replies[1]["media_type"] == "application/json"
    finally:
        await nc.close()
        await stop_cluster(orch, agents)
