"""The `MARS_DATA` object store bucket: where outputs above the inline threshold cross.

Objects are written and read in the JetStream object store's own format (chunks on
`$O.<bucket>.C.<nuid>`, a rolled-up `ObjectInfo` on `$O.<bucket>.M.<name>`), so any NATS
client reads them (`nats object get`), but not with nats-py's `ObjectStore.put`/`get`, which
are slow for outputs of many chunks: `put` waits for the server's acknowledgement of each chunk
before it sends the next and hashes the bytes again, `get` joins the chunks by concatenation
(quadratic in the number of chunks) and answers the server's flow control only every 0.25 s
(a stall per window).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import hashlib
import json
from collections import deque
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

from nats.js.api import Header, ObjectInfo, ObjectMetaOptions, ObjectStoreConfig
from nats.js.errors import BucketNotFoundError, ObjectNotFoundError
from nats.js.kv import MSG_ROLLUP_SUBJECT
from nats.js.object_store import (
    OBJ_CHUNKS_PRE_TEMPLATE,
    OBJ_DIGEST_TEMPLATE,
    OBJ_META_PRE_TEMPLATE,
    OBJ_STREAM_TEMPLATE,
)
from nats.nuid import NUID

from edge_agent.config import AgentConfig
from schemas import subjects
from schemas.limits import MAX_OUTPUT_BYTES
from transport import connect

#: Chunks of an object being put that may wait for the server's acknowledgement at once.
PUT_WINDOW = 16
#: Longest wait for the server to acknowledge a chunk put, or to send the next chunk read.
CHUNK_TIMEOUT_S = 10.0
BUCKET = subjects.DATA_BUCKET
#: The thread that hashes the chunks of objects being read, as they arrive, off the event loop
#: (hashlib lets go of the GIL): in order, one at a time.
HASHER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mars-sha256")
#: Bytes of chunks handed to it at once (one hand-over per chunk of 128 KiB costs more than
#: it saves).
HASH_BATCH = 4 << 20
STREAM = OBJ_STREAM_TEMPLATE.format(bucket=BUCKET)


def chunks_subject(nuid: str) -> str:
    return OBJ_CHUNKS_PRE_TEMPLATE.format(bucket=BUCKET, obj=nuid)


def meta_subject(key: str) -> str:
    return OBJ_META_PRE_TEMPLATE.format(
        bucket=BUCKET, obj=base64.urlsafe_b64encode(key.encode()).decode()
    )


def object_digest(sha256_hex: str) -> str:
    """The object store's digest of bytes whose sha256 is `sha256_hex`."""
    return OBJ_DIGEST_TEMPLATE.format(
        digest=base64.urlsafe_b64encode(bytes.fromhex(sha256_hex)).decode()
    )


def _update(digest: Any, chunks: list[bytes]) -> None:
    for chunk in chunks:
        digest.update(chunk)


async def _digest_of(data: bytes, sha256: str | Awaitable[str] | None) -> str:
    if isinstance(sha256, str):
        return sha256
    if sha256 is not None:
        return await sha256
    return hashlib.sha256(data).hexdigest()


class Objects:
    """The bucket, created (bounded by TTL and bytes) if missing, and its objects."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._bucket: Any = None
        self._js: Any = None
        self._nuid = NUID()

    async def bucket(self, js: Any) -> Any:
        if self._bucket is None or self._js is not js:
            try:
                self._bucket = await js.object_store(BUCKET)
            except BucketNotFoundError:
                cfg = ObjectStoreConfig(
                    description="MARS task outputs above the inline threshold",
                    ttl=self.config.object_ttl_s,
                    max_bytes=self.config.object_max_bytes,
                    replicas=connect.js_replicas(),
                )
                try:
                    self._bucket = await js.create_object_store(BUCKET, config=cfg)
                except Exception:  # another agent created it first, maybe with other limits
                    self._bucket = await js.object_store(BUCKET)
            self._js = js
        return self._bucket

    async def put(
        self, js: Any, key: str, data: bytes, sha256: str | Awaitable[str] | None = None
    ) -> None:
        """Put `data` under `key` (replacing what was there) in `object_chunk_bytes`
        chunks, up to `PUT_WINDOW` of them unacknowledged; `sha256`: the bytes' digest
        when the caller has it already, or will have it by the time the chunks are stored
        (it is computed meanwhile: only the closing entry names it), else computed here."""
        bucket = await self.bucket(js)
        try:
            old: ObjectInfo | None = await bucket.get_info(key)
        except ObjectNotFoundError:
            old = None
        size = self.config.object_chunk_bytes
        nuid = self._nuid.next().decode()
        subject = chunks_subject(nuid)
        acks: deque[asyncio.Future[Any]] = deque()
        try:
            for at in range(0, len(data), size):
                if len(acks) >= PUT_WINDOW:
                    await asyncio.wait_for(acks.popleft(), CHUNK_TIMEOUT_S)
                acks.append(await js.publish_async(subject, data[at : at + size]))
            while acks:
                await asyncio.wait_for(acks.popleft(), CHUNK_TIMEOUT_S)
            info = ObjectInfo(
                name=key,
                bucket=BUCKET,
                nuid=nuid,
                size=len(data),
                chunks=-(-len(data) // size),
                mtime=datetime.now(UTC).isoformat(),
                digest=object_digest(await _digest_of(data, sha256)),
                options=ObjectMetaOptions(max_chunk_size=size),
            )
            await js.publish(
                meta_subject(key),
                json.dumps(info.as_dict()).encode(),
                headers={Header.ROLLUP: MSG_ROLLUP_SUBJECT},
            )
        except BaseException:
            for ack in acks:
                ack.cancel()
            with contextlib.suppress(Exception):
                await js.purge_stream(STREAM, subject=subject)
            raise
        if old is not None and not old.deleted and old.nuid:
            await js.purge_stream(STREAM, subject=chunks_subject(old.nuid))

    async def get(self, js: Any, key: str) -> bytes:
        return (await self.read(js, key))[0]

    async def read(self, js: Any, key: str) -> tuple[bytes, str]:
        """The object's bytes and their sha256 (hex), its chunks taken one by one from an
        ordered consumer, hashed as they come, and joined once. The object's own digest is
        not checked: the receiver checks the producer's sha256, which is what matters (the
        object's digest says only that it is intact, not that it is the producer's output)."""
        bucket = await self.bucket(js)
        info = await bucket.get_info(key)
        if info.is_link() or not info.nuid:
            raise ValueError(f"object {key} is a link or has no chunks")  # MARS puts neither
        if info.size > MAX_OUTPUT_BYTES:
            raise ValueError(f"object {key} of {info.size} B exceeds {MAX_OUTPUT_BYTES} B")
        digest = hashlib.sha256()
        if not info.size:
            return b"", digest.hexdigest()
        sub = await js.subscribe(chunks_subject(info.nuid), ordered_consumer=True)
        parts: list[bytes] = []
        got = 0
        batch: list[bytes] = []
        batched = 0
        hashed: concurrent.futures.Future[None] | None = None
        try:
            while True:
                # next_msg answers the server's flow control as soon as the chunk before it
                # is taken (nats-py's message iterator leaves it to a poll every 0.25 s)
                msg = await sub.next_msg(timeout=CHUNK_TIMEOUT_S)
                parts.append(msg.data)
                batch.append(msg.data)
                batched += len(msg.data)
                got += len(msg.data)
                if got > info.size:
                    raise ValueError(f"object {key} has more than its {info.size} B")
                last = msg.metadata.num_pending == 0
                if batched >= HASH_BATCH or last:
                    hashed = HASHER.submit(_update, digest, batch)
                    batch, batched = [], 0
                if last:
                    break
        finally:
            await sub.unsubscribe()
        if hashed is not None:
            await asyncio.wrap_future(hashed)  # the last chunk's: all before it are done
        return b"".join(parts), digest.hexdigest()

    async def delete(self, js: Any, key: str) -> None:
        bucket = await self.bucket(js)
        await bucket.delete(key)
