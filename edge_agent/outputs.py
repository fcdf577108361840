"""Each task's output kept for its pipeline's retention, so a user can fetch it (`mars get`):
the JetStream object store bucket `MARS_OUTPUTS`, key `<pipeline>/<task>/<token>`, written by
the agent that ran the task before it reports the task's end. Synthetic tasks' outputs (zeros
of a declared size) are placeholders and are not kept.

The bucket's age limit is the pipelines' retention (`ownership.KEEP_S` by default; agents use
their own `output_keep_s`); the first agent or orchestrator to need it creates it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig
from nats.js.errors import BucketNotFoundError

from schemas import subjects
from transport import connect

log = logging.getLogger("mars.agent.outputs")
#: Chunks of an output in the bucket (a message each; well under the server's max payload).
CHUNK_BYTES = 256 << 10
#: Most time a put may take, on top of what its size needs at 10 MB/s.
PUT_S = 10.0


def output_key(pipeline_id: str, task_id: str, token: int) -> str:
    return f"{pipeline_id}/{task_id}/{token}"


async def bucket(js: Any, keep_s: float, create: bool = True) -> Any:
    """The outputs bucket, made if missing (`create`) with `keep_s` as its age limit."""
    try:
        return await js.object_store(subjects.OUTPUTS_BUCKET)
    except BucketNotFoundError:
        if not create:
            raise
    cfg = ObjectStoreConfig(
        description="MARS task outputs, for their pipelines' retention",
        ttl=keep_s,
        replicas=connect.js_replicas(),
    )
    try:
        return await js.create_object_store(subjects.OUTPUTS_BUCKET, config=cfg)
    except Exception:  # another agent made it first
        return await js.object_store(subjects.OUTPUTS_BUCKET)


class OutputStore:
    """An agent's writer to the outputs bucket."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._bucket: Any = None
        self._js: Any = None
        self.kept = 0

    async def put(self, js: Any, key: str, data: bytes) -> bool:
        """Keep `data` under `key`; False (logged) if it could not be written in time (the
        task's end is reported all the same, its output then not fetchable)."""
        try:
            if self._bucket is None or self._js is not js:
                self._bucket, self._js = await bucket(js, self.keep_s), js
            opts = ObjectMetaOptions(max_chunk_size=CHUNK_BYTES)
            async with asyncio.timeout(PUT_S + len(data) / 10e6):
                await self._bucket.put(key, data, meta=ObjectMeta(name=key, options=opts))
        except Exception as exc:
            log.warning("output %s not kept for fetching: %r", key, exc)
            return False
        self.kept += 1
        return True
