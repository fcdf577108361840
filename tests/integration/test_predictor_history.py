"""Correction history lives in JetStream KV: a new orchestrator instance reloads what an earlier
one learned from reported durations (real nats-server, real KV, real ONNX Runtime)."""

from __future__ import annotations

import pytest

from orchestrator.infra.kvwatch import all_keys
from orchestrator.predictor.history import BUCKET, History, kv_key
from orchestrator.predictor.model import task_signature
from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from schemas import AgentAdvert, PipelineSpec
from schemas.codec import decode
from schemas.events import TaskEvent
from schemas.predictor import CorrectionRecord

pytestmark = pytest.mark.integration

SPEC = PipelineSpec.model_validate({"name": "p", "tasks": [
    {"id": "cnn", "run": {"kind": "onnx", "model": "tiny_cnn", "batch": 4}},
]})  # fmt: skip
ADVERT = AgentAdvert.model_validate({
    "agent_id": "a1", "incarnation": "i1", "site": "s", "tier": "edge",
    "devices": [{"device_id": "cpu", "kind": "cpu", "gflops": 50.0,
                 "mem_bandwidth_gbps": 12.0, "call_overhead_ms": 0.1, "calibrated": True}],
})  # fmt: skip


def _finished(run: PipelineRun, n: int, seconds: float) -> TaskEvent:
    tr = run.tasks["cnn"]
    tr.agent_id, tr.device_id, tr.token, tr.state = "a1", "cpu", 1, "started"
    tr.predicted_s = 0.001
    return TaskEvent(
        event_id=f"e{n}", pipeline_id=run.pipeline_id, task_id="cnn", agent_id="a1",
        incarnation="i1", device_id="cpu", token=1, state="succeeded", duration_s=seconds,
    )  # fmt: skip


async def test_corrections_persist_and_reload(nats_url: str) -> None:
    a = Orchestrator(nats_url, name="orch-a")
    await a.start()
    try:
        a.view.on_advert(ADVERT, a.mono())
        kv = await a.js.key_value(BUCKET)
        watch = await kv.watch(kv_key(task_signature(SPEC.tasks[0]), "a1:cpu"))
        assert await watch.updates(timeout=5) is None  # end of the (empty) initial values
        for n in range(4):  # four runs of the same task, each 0.03 s on the agent
            run = PipelineRun(f"p{n}", SPEC, a.mono())
            a.pipelines[run.pipeline_id] = run
            run.committed_at = a.mono()
            run.apply(_finished(run, n, 0.03), a.mono())
            a._learn(run, _finished(run, n, 0.03))
        # writes are batched per flush window: the key converges to the track after 4 runs
        # in at most a few writes (one per window), never one write per report
        seen = 0
        while True:
            entry = await watch.updates(timeout=5)
            assert entry is not None
            seen += 1
            stored = decode(bytes(entry.value), CorrectionRecord)
            if stored.track.n == 4:
                break
        assert stored.device == "a1:cpu" and seen < 4
        learned = a.predictor.estimate(SPEC.tasks, [ADVERT.devices[0]], ["a1:cpu"])
        assert learned.seconds[0, 0] == pytest.approx(0.03, rel=0.02)
        assert a.prediction_errors.n == 4
        await watch.stop()
    finally:
        await a.stop()

    b = Orchestrator(nats_url, name="orch-b")  # a fresh instance: nothing in memory
    await b.start()
    try:
        est = b.predictor.estimate(SPEC.tasks, [ADVERT.devices[0]], ["a1:cpu"])
        assert est.seconds[0, 0] == pytest.approx(0.03, rel=0.02)
        assert est.factor[0, 0] != 1.0
    finally:
        await b.stop()


async def test_an_unreadable_record_is_skipped_and_the_rest_loaded(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Hostile or foreign bytes in the bucket cost that one track, not the orchestrator."""
    a = Orchestrator(nats_url, name="orch-a")
    await a.start()
    try:
        kv = await a.js.key_value(BUCKET)
        await kv.put("junk.0000000000000000", b"\xc1 not a record")
    finally:
        await a.stop()
    b = Orchestrator(nats_url, name="orch-b")
    await b.start()
    try:
        assert b.history is not None and b.predictor.corrections is not None
        assert any("unreadable" in r.getMessage() for r in caplog.records)
    finally:
        await b.stop()


async def test_a_single_sample_is_not_written_and_a_second_one_is(nats_url: str) -> None:
    """One report of a (task, device) costs no KV write (not even at stop); the second
    makes the track worth keeping, and it is written."""
    a = Orchestrator(nats_url, name="orch-a")
    await a.start()
    try:
        # no flush loop: flushed here only
        hist = History(a.js, a.predictor.corrections, list_keys=all_keys)
        await hist.start()
        task, dev = SPEC.tasks[0], ADVERT.devices[0]
        changed = a.predictor.observe(task, "a1:cpu", dev, 0.05, 0.0)
        assert changed is not None
        hist.mark(*changed)
        assert await hist.flush() == 0
        assert await hist.flush(final=True) == 0
        assert not hist.held and not hist.dirty  # nothing kept around for a single sample
        changed = a.predictor.observe(task, "a1:cpu", dev, 0.05, 1.0)
        assert changed is not None
        hist.mark(*changed)
        assert await hist.flush() == 1 and hist.writes == 1
        kv = await a.js.key_value(BUCKET)
        entry = await kv.get(kv_key(task_signature(task), "a1:cpu"))
        assert decode(bytes(entry.value or b""), CorrectionRecord).track.n == 2
    finally:
        await a.stop()


async def test_the_bucket_forgets_what_nobody_writes_for_a_month(nats_url: str) -> None:
    """Entries expire KEEP_S after their last write (a track still in use is written again
    well before, see `due`): the bucket does not keep every signature ever seen."""
    from orchestrator.predictor.history import KEEP_S

    a = Orchestrator(nats_url, name="orch-a")
    await a.start()
    try:
        info = await a.js.stream_info(f"KV_{BUCKET}")
        assert info.config.max_age == pytest.approx(KEEP_S)
    finally:
        await a.stop()
