"""Pipelines' keys in KV (spec, record, committed results) expire `ownership.KEEP_S` after
their last write: a live pipeline's are written again before, an ended one's go (over a real
nats-server, with the buckets' max age cut to seconds)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.errors import KeyNotFoundError

from orchestrator.reliability import ownership
from orchestrator.reliability.results import HISTORY, ResultLedger, result_key
from orchestrator.service import Orchestrator
from schemas import PipelineSpec
from schemas.failover import OWNERS_BUCKET, RUNS_BUCKET, run_key, spec_key
from schemas.subjects import RESULTS_BUCKET
from tests.harness import RecordingAgent, agent_config

pytestmark = pytest.mark.integration

KEEP = 1.5


async def present(kv: Any, key: str) -> bool:
    try:
        await kv.get(key)
        return True
    except KeyNotFoundError:
        return False


async def value_of(kv: Any, key: str) -> bytes | None:
    try:
        return bytes((await kv.get(key)).value or b"")
    except KeyNotFoundError:
        return None


async def written(kv: Any, key: str, timeout: float) -> None:
    """Until `key` has a value (the bucket's watcher says so; one there already counts)."""
    watcher = await kv.watch(key)
    try:
        async with asyncio.timeout(timeout):
            while not (entry := await watcher.updates(timeout=timeout)) or not entry.value:
                pass
    finally:
        await watcher.stop()


async def aged_out(js: Any, keys: list[tuple[Any, str]], timeout: float) -> None:
    """Until every key has expired by its bucket's max age. That leaves nothing to watch
    unless the stream writes subject delete markers, which the production buckets do not:
    they are turned on here (the expiry itself is the same), and each key still there is
    awaited until its marker comes."""
    buckets = {kv._name for kv, _ in keys}  # the bucket's name
    for bucket in buckets:
        info = await js.stream_info(f"KV_{bucket}")
        cfg = replace(info.config, allow_msg_ttl=True, subject_delete_marker_ttl=60.0)
        await js.update_stream(config=cfg)
    markers: asyncio.Queue[str] = asyncio.Queue()

    async def marker(msg: Msg) -> None:
        if msg.headers and msg.headers.get("Nats-Marker-Reason"):
            await markers.put(msg.subject)

    subs = [  # markers are stored, not published: a consumer of the stream sees them
        await js.subscribe(
            f"$KV.{kv._name}.{key}",
            cb=marker,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
        )
        for kv, key in keys
    ]
    try:
        left = {f"$KV.{kv._name}.{key}" for kv, key in keys if await present(kv, key)}
        async with asyncio.timeout(timeout):
            while left:
                left.discard(await markers.get())
        # what is left under each key is its marker: no value
        assert not [key for kv, key in keys if await value_of(kv, key)]
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def test_a_live_pipeline_outlives_the_max_age_and_an_ended_one_goes(nats_url: str) -> None:
    orch = Orchestrator(nats_url, keep_s=KEEP)
    fo = orch.failover
    fo.renew_s, fo.refresh_s = 0.2, KEEP / 5  # looked at every 60 s, or twice per refresh
    assert fo.keep_fresh_every() == pytest.approx(KEEP / 10)
    await orch.start()
    try:
        js = orch.js
        for bucket in (OWNERS_BUCKET, RUNS_BUCKET, RESULTS_BUCKET):  # `--keep-hours` reaches all
            assert (await (await js.key_value(bucket)).status()).ttl == pytest.approx(KEEP)
        keys = await keys_outlive_the_run(orch, nats_url)
        # ended: nothing writes them again, and they go
        await aged_out(js, keys, 4 * KEEP)
    finally:
        await orch.stop()


async def test_a_shorter_max_age_from_another_replica_is_followed(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each replica sets the buckets' max age to its own `--keep-hours` when it starts: one
    with an hour, then another with seconds. The first must write its live pipelines' keys
    again within the shorter age, or they expire while the pipelines run."""
    orch = Orchestrator(nats_url, keep_s=3600.0)
    fo = orch.failover
    fo.renew_s, fo.keep_fresh_check_s = 0.2, KEEP / 10
    assert fo.refresh_every() == pytest.approx(1200.0)
    await orch.start()
    try:
        for bucket in (OWNERS_BUCKET, RUNS_BUCKET, RESULTS_BUCKET):  # what the other's start does
            await ownership.open_bucket(orch.js, bucket, ttl=KEEP)
        caplog.set_level(logging.WARNING, logger="mars.failover")
        await keys_outlive_the_run(orch, nats_url)
        assert fo.buckets_keep_s == pytest.approx(KEEP)
        assert fo.refresh_every() == pytest.approx(KEEP / 3)
        said = [r.getMessage() for r in caplog.records if "--keep-hours" in r.getMessage()]
        assert len(said) == 1 and "keep keys 2 s, not this replica's 3600 s" in said[0]
    finally:
        await orch.stop()


async def keys_outlive_the_run(orch: Orchestrator, nats_url: str) -> list[tuple[Any, str]]:
    """A pipeline that runs three times the buckets' max age (`KEEP`) keeps its spec, record
    and result keys throughout; they are returned, with their buckets, once it ended."""
    fo = orch.failover
    agent = RecordingAgent(nats_url, agent_config("s", "edge"), agent_id="a1", calibrate=False)
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        spec = PipelineSpec.model_validate({"name": "long", "tasks": [
            {"id": "quick", "run": {"kind": "synthetic", "seconds": 0}},
            {"id": "long", "deps": ["quick"], "run": {"kind": "synthetic", "seconds": 3 * KEEP}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, pipeline_id="p")
        runs, results = fo.runs.kv, orch.recovery.ledger.kv  # type: ignore[union-attr]
        keys = [(runs, spec_key("p")), (runs, run_key("p")), (results, result_key("p", 0))]
        await written(results, result_key("p", 0), 10.0)  # the quick task's result
        # every key stays while the pipeline runs, three times their max age: looked at
        # every 0.1 s until the pipeline's end (awaited, with a deadline)
        ended = asyncio.ensure_future(orch.wait_terminal("p", 6 * KEEP))
        looked = 0
        while not ended.done():
            for kv, key in keys:
                assert await present(kv, key), f"{key} expired while its pipeline ran"
            looked += 1
            await asyncio.wait({ended}, timeout=0.1)
        assert (await ended).state == "succeeded"
        assert looked >= 10 and fo.kept_fresh >= 3
        return keys
    finally:
        await agent.stop()


async def test_committed_results_expire_in_a_new_bucket_and_in_an_old_one(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ResultLedger(js, "orch-1").start()  # the default: a day
        assert (await (await js.key_value(RESULTS_BUCKET)).status()).ttl == ownership.KEEP_S
        ledger = ResultLedger(js, "orch-1", bucket="MARS_RESULTS_NEW", keep_s=KEEP)
        await ledger.start()
        assert (await ledger.kv.status()).ttl == pytest.approx(KEEP)
        # a bucket an older version made keeps every chunk for ever: it is given the max age
        old = "MARS_RESULTS_OLD"
        await js.create_key_value(bucket=old, history=HISTORY)
        assert not (await (await js.key_value(old)).status()).ttl
        upgraded = ResultLedger(js, "orch-1", bucket=old, keep_s=KEEP)
        await upgraded.start()
        status = await upgraded.kv.status()
        assert status.ttl == pytest.approx(KEEP) and status.history == HISTORY
        # another --keep-hours: the existing bucket follows it, and keeps what it holds
        await upgraded.kv.put("p.0", b"kept")
        again = ResultLedger(js, "orch-2", bucket=old, keep_s=2 * KEEP)
        await again.start()
        assert (await again.kv.status()).ttl == pytest.approx(2 * KEEP)
        assert (await again.kv.get("p.0")).value == b"kept"
    finally:
        await nc.close()
