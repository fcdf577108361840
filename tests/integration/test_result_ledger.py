"""The result ledger over a real nats-server: first commit wins, later ones say why not, and
`revisions` counts every revision the bucket holds (the exactly-once audit)."""

from __future__ import annotations

import nats
import pytest

from orchestrator.results import ResultLedger, result_key, revisions
from schemas.codec import encode
from schemas.events import TaskEvent
from schemas.recovery import TaskResult

pytestmark = pytest.mark.integration


def succeeded(task: str, token: int, event: str) -> TaskEvent:
    return TaskEvent(
        event_id=event, pipeline_id="p1", task_id=task, agent_id="a1", incarnation="i1",
        device_id="cpu0", token=token, state="succeeded", duration_s=0.01,
    )  # fmt: skip


async def test_first_commit_wins_and_revisions_counts_each_write(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        ledger = ResultLedger(js, "orch-1")
        await ledger.start()
        assert await revisions(js, "p1") == {}
        assert await ledger.commit(succeeded("a", 3, "e1")) == "committed"
        assert await ledger.commit(succeeded("a", 3, "e1")) == "duplicate"
        assert await ledger.commit(succeeded("a", 2, "e0")) == "stale"
        assert await ledger.commit(succeeded("a", 4, "e2")) == "rerun"
        assert await ledger.commit(succeeded("b", 1, "e3")) == "committed"
        await ledger.commit(succeeded("x", 1, "e4").model_copy(update={"pipeline_id": "p2"}))
        got = await revisions(js, "p1")
        assert {t: [r.event_id for r in rs] for t, rs in got.items()} == {"a": ["e1"], "b": ["e3"]}
        # a second write of one key (what exactly-once forbids) is seen, oldest first
        forced = TaskResult.of(succeeded("b", 9, "e9"), "intruder")
        await ledger.kv.put(result_key("p1", "b"), encode(forced))
        again = await revisions(js, "p1")
        assert [r.event_id for r in again["b"]] == ["e3", "e9"] and len(again["a"]) == 1
        assert list(await revisions(js, "p2")) == ["x"]
    finally:
        await nc.close()
