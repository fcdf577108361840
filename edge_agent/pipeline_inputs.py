"""A pipeline's inputs, fetched by the agent of a task that takes one when the task starts:
from the object store bucket `MARS_INPUTS`, by the sha256 the pipeline names, and checked
against it before the task sees a byte."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from nats.js.errors import BucketNotFoundError, NotFoundError

from schemas import subjects
from schemas.pipeline import PipelineInput

#: Most time a fetch may take, on top of what its size needs at 10 MB/s.
FETCH_S = 10.0


class InputMissing(Exception):
    """A pipeline input not to be had: not stored, gone, or not what its digest says."""


async def fetch(js: Any, given: PipelineInput) -> bytes:
    """The input's bytes, checked against its sha256 and size."""
    try:
        bucket = await js.object_store(subjects.INPUTS_BUCKET)
        async with asyncio.timeout(FETCH_S + given.size / 10e6):
            data = bytes((await bucket.get(given.sha256)).data or b"")
    except (BucketNotFoundError, NotFoundError) as exc:
        raise InputMissing(
            f"pipeline input {given.name} ({given.sha256[:12]}...) is not in "
            f"{subjects.INPUTS_BUCKET} (never stored, or past its retention)"
        ) from exc
    except TimeoutError as exc:
        raise InputMissing(f"pipeline input {given.name}: fetch timed out") from exc
    digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
    if digest != given.sha256 or len(data) != given.size:
        raise InputMissing(
            f"pipeline input {given.name}: {len(data)} B hashing to {digest[:12]}..., not the "
            f"{given.size} B {given.sha256[:12]}... the pipeline names"
        )
    return data
