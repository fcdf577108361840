"""Exactly-once commit of task results: one KV key per task, created once by CAS.

The pipeline state machine already drops repeated events (by event id) and events of a
superseded placement (agent or fencing token differ). That protects one replica's memory; the
commit protects the record. A result is written to `MARS_RESULTS` under `<pipeline>.<task>`
with `create` (a compare-and-set against "no revision yet"), so whichever replica or redelivery
comes second loses the race and is counted, never written. A task re-run because its output was
lost with its agent produces the same result again: the first commit stands.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Literal

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, KeyWrongLastSequenceError

from schemas import subjects
from schemas.codec import DecodeError, decode, encode
from schemas.events import TaskEvent
from schemas.recovery import TaskResult

log = logging.getLogger("mars.results")
Outcome = Literal["committed", "duplicate", "stale", "rerun", "error"]


def result_key(pipeline_id: str, task_id: str) -> str:
    return f"{pipeline_id}.{task_id}"


class ResultLedger:
    def __init__(self, js: Any, owner: str, *, bucket: str = subjects.RESULTS_BUCKET) -> None:
        self.js = js
        self.owner = owner
        self.bucket = bucket
        self.kv: Any = None

    async def start(self) -> None:
        try:
            self.kv = await self.js.key_value(self.bucket)
        except BucketNotFoundError:
            with contextlib.suppress(Exception):  # a concurrent replica may create it first
                await self.js.create_key_value(bucket=self.bucket, history=4)
            self.kv = await self.js.key_value(self.bucket)

    async def commit(self, ev: TaskEvent) -> Outcome:
        """Commit a `succeeded` event's result unless one is already there (then say why not)."""
        rec = TaskResult.of(ev, self.owner[:256])
        key = result_key(ev.pipeline_id, ev.task_id)
        try:
            await self.kv.create(key, encode(rec))
            return "committed"
        except KeyWrongLastSequenceError:
            pass
        except Exception as exc:
            log.warning("committing %s failed: %s", key, exc)
            return "error"
        cur = await self.get(ev.pipeline_id, ev.task_id)
        if cur is None:
            return "error"
        if cur.token == ev.token:
            return "duplicate"
        return "stale" if cur.token > ev.token else "rerun"

    async def get(self, pipeline_id: str, task_id: str) -> TaskResult | None:
        try:
            entry = await self.kv.get(result_key(pipeline_id, task_id))
            return decode(entry.value, TaskResult)
        except (KeyNotFoundError, DecodeError):
            return None


async def revisions(
    js: Any, pipeline_id: str, *, bucket: str = subjects.RESULTS_BUCKET
) -> dict[str, list[TaskResult]]:
    """Every revision the bucket still holds of each result of a pipeline (an audit: exactly
    once means one each), oldest first.

    Counted by the server first (stream info per subject), then exactly that many messages
    read: nats-py's `kv.history` decides "no more" from a consumer-info race and can return
    nothing for a key that has a value.
    """
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}.{pipeline_id}."
    info = await js.stream_info(stream, subjects_filter=prefix + ">")
    total = sum((info.state.subjects or {}).values())
    out: dict[str, list[TaskResult]] = {}
    if not total:
        return out
    sub = await js.subscribe(prefix + ">", stream=stream, ordered_consumer=True)
    try:
        for _ in range(total):
            msg = await sub.next_msg(timeout=5.0)
            task_id = msg.subject[len(prefix) :]
            if msg.data:  # a delete or purge marker holds no result
                out.setdefault(task_id, []).append(decode(msg.data, TaskResult))
    finally:
        await sub.unsubscribe()
    return out
