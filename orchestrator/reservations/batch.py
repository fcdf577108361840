"""Atomic multi-key writes to a JetStream KV bucket (nats-server 2.12+, ADR-50 batches).

A placement books several devices, and a finished pipeline releases them; written one key at a
time, each is a request and an acknowledgement. Sent as one atomic batch, every message carries
its own compare-and-set (`Nats-Expected-Last-Subject-Sequence`) and the server stores all of
them, at consecutive stream sequences, or none: one acknowledgement, and no partial booking to
undo when a replica got to one of the keys first.

The bucket's stream must allow atomic publishing (`enable`); a server that does not keep the
setting gets the one-key-at-a-time path.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from nats.js.api import Header

log = logging.getLogger("mars.reservations")
#: How long the last message of a batch waits for the server's answer.
COMMIT_TIMEOUT_S = 5.0
#: The server refuses larger batches (ADR-50: 1,000 messages).
MAX_BATCH = 1000


class BatchFailed(Exception):
    """Nothing of the batch was written (a compare-and-set failed, or the server refused it);
    after a timeout the outcome is unknown, which the caller's per-key CAS path settles."""

    def __init__(self, message: str, err_code: int = 0) -> None:
        super().__init__(message)
        self.err_code = err_code


async def enable(js: Any, stream: str) -> bool:
    """Let `stream` take atomic batches; whether the server keeps the setting."""
    try:
        info = await js.stream_info(stream)
        if not info.config.allow_atomic:
            cfg = info.config
            cfg.allow_atomic = True
            info = await js.update_stream(cfg)
        return bool(info.config.allow_atomic)
    except Exception as exc:  # an older server, or no permission: one key at a time
        log.info("atomic batches unavailable on %s: %s", stream, exc)
        return False


async def write(nc: Any, bucket: str, items: Sequence[tuple[str, bytes, int]]) -> list[int]:
    """Write every `(key, value, expected revision)` (0: the key must not exist) in one atomic
    batch; the revision each key got, in order. Raises BatchFailed when nothing was written."""
    if not 1 <= len(items) <= MAX_BATCH:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH} writes, not {len(items)}")
    if len({k for k, _, _ in items}) != len(items):
        raise ValueError("a batch writes each key once")
    batch_id = uuid.uuid4().hex
    n = len(items)
    for i, (key, value, last) in enumerate(items, 1):
        headers = {
            Header.BATCH_ID: batch_id,
            Header.BATCH_SEQUENCE: str(i),
            Header.EXPECTED_LAST_SUBJECT_SEQUENCE: str(last),
        }
        subject = f"$KV.{bucket}.{key}"
        if i < n:
            await nc.publish(subject, value, headers=headers)
            continue
        headers[Header.BATCH_COMMIT] = "1"
        try:
            msg = await nc.request(subject, value, headers=headers, timeout=COMMIT_TIMEOUT_S)
        except Exception as exc:
            raise BatchFailed(f"no answer to a batch of {n}: {type(exc).__name__} {exc}") from exc
    try:
        ack = json.loads(msg.data)
    except ValueError as exc:
        raise BatchFailed(f"unreadable batch answer: {msg.data[:200]!r}") from exc
    err = ack.get("error")
    if err:
        raise BatchFailed(str(err.get("description", err)), int(err.get("err_code", 0)))
    seq, count = ack.get("seq"), ack.get("count")
    if not isinstance(seq, int) or count != n:
        raise BatchFailed(f"unexpected batch answer: {ack}")
    # an atomic batch is stored at consecutive sequences, the commit message last
    return [seq - n + i for i in range(1, n + 1)]
