"""Pipeline inputs stored before a pipeline is placed: each file streamed into the object
store bucket `MARS_INPUTS` under its sha256 (content-addressed: stored once, whoever sends it
again), described in the spec by name, digest, size and media type."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig
from nats.js.errors import BucketNotFoundError, NotFoundError

from orchestrator.reliability import ownership
from schemas import subjects
from schemas.digests import sha256_file
from schemas.pipeline import MediaType, PipelineInput
from transport import connect

CHUNK_BYTES = 256 << 10
#: Media types by file suffix; anything else is bytes (`.npy`/`.npz` are known by their bytes).
SUFFIX_TYPES: dict[str, MediaType] = {".json": "application/json", ".txt": "text/plain"}


async def bucket(js: Any, keep_s: float = ownership.KEEP_S) -> Any:
    try:
        return await js.object_store(subjects.INPUTS_BUCKET)
    except BucketNotFoundError:
        cfg = ObjectStoreConfig(
            description="MARS pipeline inputs, by sha256",
            ttl=keep_s,
            replicas=connect.js_replicas(),
        )
        try:
            return await js.create_object_store(subjects.INPUTS_BUCKET, config=cfg)
        except Exception:  # made by another client meanwhile
            return await js.object_store(subjects.INPUTS_BUCKET)


def describe(name: str, path: Path) -> PipelineInput:
    """The input as a spec names it (reads the file once, for its digest)."""
    return PipelineInput(
        name=name, sha256=sha256_file(path), size=path.stat().st_size,
        media_type=SUFFIX_TYPES.get(path.suffix.lower()),
    )  # fmt: skip


async def put(js: Any, given: PipelineInput, path: Path, now: datetime | None = None) -> bool:
    """Store the file under its digest unless it is there, and fresh; True if it was sent.

    A copy is kept for the bucket's age limit from when it was stored, not from when a
    pipeline names it: one past half its age limit is stored again, so that a pipeline
    submitted now does not lose its input midway (`now`: the clock, for tests)."""
    b = await bucket(js)
    try:
        info = await b.get_info(given.sha256)
        if info.size == given.size and not info.deleted:
            keep_s = (await b.status()).stream_info.config.max_age or 0.0
            stored = datetime.fromisoformat(info.mtime) if info.mtime else None
            age = ((now or datetime.now(UTC)) - stored).total_seconds() if stored else 0.0
            if not keep_s or age < keep_s / 2:
                return False
    except NotFoundError:
        pass
    opts = ObjectMetaOptions(max_chunk_size=CHUNK_BYTES)
    fh = await asyncio.to_thread(open, path, "rb")  # read a chunk at a time by the put
    try:
        await b.put(given.sha256, fh, meta=ObjectMeta(name=given.sha256, options=opts))
    finally:
        fh.close()
    return True
