"""A cancel reaches the replica holding the pipeline, whichever replica the queue group gives
it to, over a real nats-server: one given to another replica is passed on; one made by a
replica whose lease had lapsed is passed on to the replica that adopted the pipeline."""

from __future__ import annotations

import time
from typing import Any

import nats
import pytest

from orchestrator.service import Orchestrator
from schemas import subjects
from schemas.api import CancelReply, CancelRequest, StatusRequest
from schemas.codec import RemoteError, encode
from schemas.errors import ServiceError
from schemas.failover import OWNERS_BUCKET, RUNS_BUCKET, OwnerLease, spec_key
from tests.harness import two_replicas
from tests.integration.test_failover import chain, configs, hold_renewals, settled_record
from transport.rpc import request

pytestmark = pytest.mark.integration


async def test_a_cancel_given_to_another_replica_is_passed_to_the_holder(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        async with two_replicas(nats_url, configs(1), "orch-owner", "orch-other") as (
            owner, other, _agents,
        ):  # fmt: skip
            await owner.submit_spec(chain("far", [30.0]), "far-1")
            assert "far-1" not in other.pipelines
            reply = await other.queries.cancel(
                CancelRequest(pipeline_id="far-1", reason="from the other")
            )
            assert reply.state == "cancelled"
            run = owner.pipelines["far-1"]  # cancelled where it is held, with the reason given
            assert run.state == "cancelled" and run.reason == "from the other"
            rec = await settled_record(nats_url, "far-1")
            assert rec.state == "cancelled" and rec.owner == "orch-owner"
            # ended and given back: the other answers from the record, and again and again
            for _ in range(2):
                again = await other.queries.cancel(CancelRequest(pipeline_id="far-1"))
                assert again.state == "cancelled"
            with pytest.raises(ServiceError) as nf:
                await other.queries.cancel(CancelRequest(pipeline_id="never-1"))
            assert nf.value.code == "not_found"
            # passed on to a replica that does not hold it: refused, not passed on again
            with pytest.raises(RemoteError) as refused:
                await request(
                    nc, subjects.replica_cancel("orch-other"),
                    CancelRequest(pipeline_id="far-1"), CancelReply,
                )  # fmt: skip
            assert refused.value.code == "unavailable"
    finally:
        await nc.close()


async def test_a_cancel_made_under_a_lapsed_lease_reaches_the_adopter(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner, cut off from the lease bucket (renewals held back here), cancels it; the end
    cannot be written (fenced), and another replica adopts the pipeline from a record that
    says running. When the old owner finds its lease taken it passes the cancel on: before,
    the adopter ran the pipeline to its end, after the client had been told cancelled."""
    async with two_replicas(nats_url, configs(1), "orch-first", "orch-second") as (
        first, second, _agents,
    ):  # fmt: skip
        renewing = hold_renewals(first, monkeypatch)
        try:
            reply = await first.submit_spec(chain("lost", [0.05, 30.0]), "lost-1")
            assert reply.state == "running"
            # what an unrenewed lease comes to
            first.failover.leases.held["lost-1"].valid_until = first.mono()
            assert not first.failover.may_act("lost-1")
            got = await first.queries.cancel(CancelRequest(pipeline_id="lost-1", reason="lapsed"))
            assert got.state == "cancelled"
            await second.wait_for(lambda: "lost-1" in second.pipelines, 20.0)
            assert not second.pipelines["lost-1"].terminal  # resumed as the record says
            renewing.set()  # the first finds its lease taken, and passes the cancel on
            run = await second.wait_terminal("lost-1", 20.0)
            assert run.state == "cancelled" and run.reason == "lapsed"
            rec = await settled_record(nats_url, "lost-1")
            assert rec.state == "cancelled" and rec.owner == "orch-second"
        finally:
            renewing.set()


async def test_a_pipeline_no_replica_holds_now_is_ask_again_not_not_found(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner's lease lapsed (the server away longer than a lease) before the owner wrote
    its first record (after the reply): a cancel or a status given to another replica then
    was answered `not_found`, and its client took a live pipeline for one that never existed
    (`booking_stress` seed 461: answered "no pipeline", it ended succeeded). Now it is
    `unavailable`, ask again; an id never claimed is still `not_found`."""
    orch = Orchestrator(nats_url, name="other")

    async def not_yet(pid: str, lease: Any, revision: int) -> None:
        return None  # nobody adopts it while the test asks

    monkeypatch.setattr(orch.failover, "adopt", not_yet)
    await orch.start()
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        owners, runs = await js.key_value(OWNERS_BUCKET), await js.key_value(RUNS_BUCKET)
        lapsed = OwnerLease(
            pipeline_id="ghost-1", owner="orch-gone", expires=time.time() - 1.0, epoch=1
        )
        await owners.put("ghost-1", encode(lapsed))
        await runs.put(spec_key("ghost-1"), encode(chain("ghost", [0.1])))  # answered
        for ask in (
            orch.queries.cancel(CancelRequest(pipeline_id="ghost-1")),
            orch.queries.status(StatusRequest(pipeline_id="ghost-1")),
        ):
            with pytest.raises(ServiceError) as later:
                await ask
            assert later.value.code == "unavailable", later.value
        for ask in (
            orch.queries.cancel(CancelRequest(pipeline_id="never-1")),
            orch.queries.status(StatusRequest(pipeline_id="never-1")),
        ):
            with pytest.raises(ServiceError) as nf:
                await ask
            assert nf.value.code == "not_found"
    finally:
        await nc.close()
        await orch.stop()
