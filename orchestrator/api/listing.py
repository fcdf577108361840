"""`list` reads the pipelines' records in `MARS_RUNS`: every pipeline any replica answered for
and whose keys have not expired (`--keep-hours`), whichever replica wrote it, up or not,
restarted since or not. Replicas keep only a few ended pipelines in memory, so their memory
alone listed a fraction of them, and none after a restart.

The records are read through an ephemeral consumer on the bucket's stream that delivers the
latest revision of each `run.<pipeline>` key, in batches, the loop given its turns between
them; of each record only its head is read (`read_head`)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from orchestrator.infra.eventloop import Pacer
from schemas.api import PipelineSummary
from schemas.codec import DecodeError
from schemas.failover import RUNS_BUCKET, RecordHead, read_head, run_key

#: Records fetched per request to the server.
BATCH = 256
#: How long one batch may take before the reading is given up (an error for the caller).
FETCH_TIMEOUT_S = 5.0


async def recorded(
    js: Any, bucket: str = RUNS_BUCKET, user: str | None = None
) -> list[PipelineSummary]:
    """A summary of every pipeline with a record in `bucket`, as its last record write says
    (`user`: only those that user submitted). Raises whatever JetStream raises when the
    bucket cannot be read."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    name = f"list-{uuid.uuid4().hex[:12]}"
    last = (await js.stream_info(stream)).state.last_seq  # what was written before we began
    cfg = ConsumerConfig(
        name=name,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        filter_subject=prefix + run_key(">"),
        inactive_threshold=10.0,
        mem_storage=True,
    )
    info = await js.add_consumer(stream, config=cfg)
    heads: dict[str, RecordHead] = {}
    pacer = Pacer()
    try:
        sub = await js.pull_subscribe_bind(name=name, stream=stream)
        pending, seq = info.num_pending, 0
        # the records written while it reads come after, and are read too (they are newer);
        # a bucket that keeps being written ends the reading once it is past `last`
        while pending > 0 and seq < last:
            try:
                msgs = await sub.fetch(min(pending, BATCH), timeout=FETCH_TIMEOUT_S)
            except nats.errors.TimeoutError:
                why = f"reading {bucket}: no records for {FETCH_TIMEOUT_S:g} s"
                raise TimeoutError(why) from None
            for i, msg in enumerate(msgs):
                await pacer.pace(i + 1 < len(msgs))
                meta = msg.metadata
                pending, seq = meta.num_pending, meta.sequence.stream
                key = msg.subject[len(prefix) :]
                if _removed(msg.headers):
                    heads.pop(key, None)
                    continue
                try:
                    heads[key] = read_head(msg.data)
                except DecodeError:
                    continue  # a record this release cannot read: not listed
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    finally:
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, name)
    return [
        PipelineSummary(
            pipeline_id=h.pipeline_id, name=h.name, state=h.state, tasks=h.tasks,
            submitted=h.submitted_wall or None, owner=h.owner,
        )
        for h in heads.values()
        if user is None or h.user == user
    ]  # fmt: skip


def _removed(headers: dict[str, str] | None) -> bool:
    """A deletion, a purge or an expiry marker rather than a value."""
    if not headers:
        return False
    return headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers
