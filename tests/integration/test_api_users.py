"""Users of the API over a real nats-server: each asks on the API subjects that end in its own
name (`mars.v1.api.<op>.<user>`), sees, lists and cancels its own pipelines alone, and is
answered about another's as about one that does not exist; the unsuffixed subjects (the
admin's) see every pipeline; a pipeline keeps its user through fail-over."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable
from typing import Any

import pytest

from orchestrator.api.users import UserQueries
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, subjects
from schemas.api import (
    ListReply,
    ListRequest,
    StatusReply,
    StatusRequest,
    SubmitReply,
    SubmitRequest,
)
from schemas.codec import RemoteError
from schemas.errors import ErrorEnvelope
from schemas.failover import RUNS_BUCKET, PipelineRecord, run_key
from tests.harness import start_cluster, stop_cluster, two_replicas
from tests.integration.test_failover import chain, configs, hold_records_and_commits, kv_until
from transport.client import Client
from transport.rpc import request

pytestmark = pytest.mark.integration


def ids(reply: ListReply) -> list[str]:
    return sorted(p.pipeline_id for p in reply.pipelines)


def of(user: str, spec: PipelineSpec) -> PipelineSpec:
    return spec.model_copy(update={"user": user})


async def refused(answer: Awaitable[Any]) -> ErrorEnvelope:
    """The error envelope a request was answered with."""
    with pytest.raises(RemoteError) as err:
        await answer
    return err.value.envelope


def as_unknown(env: ErrorEnvelope, pid: str, unknown_pid: str) -> ErrorEnvelope:
    """`env` as it would read for `unknown_pid` (the answers name the id asked about)."""
    return env.model_copy(update={"message": env.message.replace(pid, unknown_pid)})


async def test_users_see_list_and_cancel_only_their_own_pipelines(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, configs())
    admin = await Client.connect(nats_url)
    alice = await Client.connect(nats_url, user="alice")
    bob = await Client.connect(nats_url, user="bob")
    try:
        assert (await alice.submit(chain("a", [30.0]), pipeline_id="alice-1")).state == "running"
        assert (await bob.submit(chain("b", [30.0]), pipeline_id="bob-1")).state == "running"
        # the admin, on the unsuffixed subject, submits one for alice (its spec names her)
        await admin.submit(of("alice", chain("c", [30.0])), pipeline_id="alice-2")
        await admin.submit(chain("d", [30.0]), pipeline_id="nobodys-1")  # nobody's
        assert orch.pipelines["alice-1"].spec.user == "alice"
        assert orch.pipelines["bob-1"].spec.user == "bob"
        assert orch.pipelines["nobodys-1"].spec.user is None

        # bob: alice's pipeline is answered as one that does not exist, word for word
        for pid in ("alice-1", "nobodys-1"):
            unknown = await refused(bob.status("no-such-1"))
            assert unknown.code == "not_found"
            assert as_unknown(await refused(bob.status(pid)), pid, "no-such-1") == unknown
            unknown = await refused(bob.cancel("no-such-1"))
            assert as_unknown(await refused(bob.cancel(pid)), pid, "no-such-1") == unknown
        assert (await admin.status("alice-1")).state == "running"  # not cancelled by bob
        assert ids(await bob.list()) == ["bob-1"]
        assert ids(await bob.list(user="alice")) == ["bob-1"]  # the subject says who asks
        assert ids(await bob.list(state="running")) == ["bob-1"]
        assert len((await bob.agents()).agents) == 2  # the fleet, read-only, for anyone

        # alice sees hers, and cancels it
        assert ids(await alice.list()) == ["alice-1", "alice-2"]
        assert (await alice.status("alice-1")).state == "running"
        assert (await alice.cancel("alice-1")).state == "cancelled"
        # the admin sees, lists and cancels everybody's
        assert ids(await admin.list()) == ["alice-1", "alice-2", "bob-1", "nobodys-1"]
        assert ids(await admin.list(user="alice")) == ["alice-1", "alice-2"]
        assert (await admin.cancel("bob-1")).state == "cancelled"
        assert (await bob.status("bob-1")).state == "cancelled"
    finally:
        for c in (admin, alice, bob):
            await c.close()
        await stop_cluster(orch, agents)


async def test_a_user_token_that_is_not_an_identity_name_is_refused(nats_url: str) -> None:
    orch, agents = await start_cluster(nats_url, configs(1))
    admin = await Client.connect(nats_url)
    try:
        await admin.submit(chain("a", [30.0]), pipeline_id="a-1")
        for user in ("al@ice", "x" * 129, "ü"):
            env = await refused(
                request(admin.nc, subjects.api_as(subjects.STATUS, user),
                        StatusRequest(pipeline_id="a-1"), StatusReply)
            )  # fmt: skip
            assert env.code == "invalid" and "user" in env.message, env
            sub = SubmitRequest(pipeline=chain("b", [0.1]), pipeline_id="b-1")
            env = await refused(
                request(admin.nc, subjects.api_as(subjects.SUBMIT, user), sub, SubmitReply)
            )
            assert env.code == "invalid", env
        assert "b-1" not in orch.pipelines
        # a spec that names another user than the subject is refused too
        sub = SubmitRequest(pipeline=of("alice", chain("b", [0.1])), pipeline_id="b-2")
        env = await refused(
            request(admin.nc, subjects.api_as(subjects.SUBMIT, "bob"), sub, SubmitReply)
        )
        assert env.code == "invalid" and "alice" in env.message, env
        assert "b-2" not in orch.pipelines
    finally:
        await admin.close()
        await stop_cluster(orch, agents)


async def test_a_users_list_and_status_pass_the_user_on_to_the_replica_holding_it(
    nats_url: str,
) -> None:
    """A pipeline with no record yet is known to the replica holding it alone: another
    replica asked for one user's list asks it for that user's alone, and answers another
    user's `status` of it as of no pipeline without asking."""
    async with two_replicas(nats_url, configs(1), "orch-first", "orch-second") as (
        first, second, _agents,
    ):  # fmt: skip
        hold = hold_records_and_commits(first)
        try:
            await second.replicas.wait_until(lambda: second.replicas.up() == ["orch-first"], 10.0)
            assert await first.wait_for_agents(1, 10.0) == 1
            await first.submit_spec(of("alice", chain("a", [30.0])), "alice-3")
            assert await second.failover.runs.record("alice-3") is None  # held there alone
            assert ids(await second.queries.list(ListRequest(user="bob"))) == []
            assert ids(await second.queries.list(ListRequest(user="alice"))) == ["alice-3"]
            assert ids(await second.queries.list(ListRequest())) == ["alice-3"]
            mine = UserQueries(second, second.queries)
            st = await mine.status(StatusRequest(pipeline_id="alice-3"), "alice")
            assert st.owner == "orch-first"  # passed on to its holder, and answered
            with pytest.raises(Exception) as err:
                await mine.status(StatusRequest(pipeline_id="alice-3"), "bob")
            assert getattr(err.value, "code", None) == "not_found"
            assert str(err.value) == "no pipeline alice-3"
        finally:
            hold.set()


async def test_a_pipeline_adopted_after_fail_over_keeps_its_user(nats_url: str) -> None:
    """Its owner stops acting (its lease lapses); the replica that adopts it resumes it from
    its record and spec as alice's: she still sees and cancels it there, bob does not, and
    the adopter's record says whose it is."""
    first, agents = await start_cluster(nats_url, configs(), name="first")
    second = Orchestrator(nats_url, name="second")
    alice = await Client.connect(nats_url, user="alice")
    bob = await Client.connect(nats_url, user="bob")
    try:
        await second.start()
        assert await second.wait_for_agents(2, 10.0) == 2
        await first.submit_spec(of("alice", chain("a", [30.0])), "adopt-1")
        rec = await kv_until(
            nats_url, RUNS_BUCKET, run_key("adopt-1"), PipelineRecord,
            lambda r: r.state == "running", 10.0,
        )  # fmt: skip
        assert rec.user == "alice" and rec.owner == "first"
        first.failover.suspend()  # it stops renewing: the lease lapses, second adopts
        await second.wait_for(lambda: "adopt-1" in second.pipelines, 20.0)
        run = second.pipelines["adopt-1"]
        assert run.spec.user == "alice" and run.owner == "second"
        assert ids(await second.queries.list(ListRequest(user="alice"))) == ["adopt-1"]
        assert ids(await second.queries.list(ListRequest(user="bob"))) == []
        assert (await refused(bob.status("adopt-1"))).code == "not_found"
        assert (await refused(bob.cancel("adopt-1"))).code == "not_found"
        assert (await alice.cancel("adopt-1")).state == "cancelled"
        got = await second.failover.runs.record("adopt-1")
        assert got is not None
        assert got[0].user == "alice" and got[0].owner == "second"
        assert got[0].state == "cancelled"
    finally:
        await alice.close()
        await bob.close()
        with contextlib.suppress(Exception):
            await second.stop()
        await stop_cluster(first, agents)
