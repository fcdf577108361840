"""`mars get`: a task's output, streamed from the outputs bucket into a file, checked against
the digest its pipeline's status gives. The bytes never pass through an orchestrator: the API
(`status`) says where the output is and what it must hash to, and the client reads the object
store itself, in chunks, into a file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from nats.js.errors import BucketNotFoundError, NotFoundError

from schemas import subjects
from schemas.api import StatusReply, TaskStatus
from schemas.digests import sha256_file


class FetchError(Exception):
    """Why an output cannot be fetched, in words for the person who asked."""


def find(st: StatusReply, task_id: str) -> TaskStatus:
    """The task whose output is asked for, if it has one to fetch."""
    ts = next((t for t in st.tasks if t.task_id == task_id), None)
    if ts is None:
        names = ", ".join(t.task_id for t in st.tasks[:20])
        raise FetchError(f"pipeline {st.pipeline_id} has no task {task_id} (its tasks: {names})")
    if ts.state != "succeeded":
        raise FetchError(f"task {task_id} is {ts.state}: it has no output (yet)")
    if ts.output_key is None or ts.output_sha256 is None:
        raise FetchError(
            f"the output of {task_id} was not kept for fetching (a synthetic task's placeholder, "
            "an output other tasks take whose task does not say keep_output: true, or its "
            "agent could not store it)"
        )
    return ts


def _member(path: Path, name: str) -> bytes:
    """One tensor of an `.npz` set, as `.npy` bytes."""
    import io

    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as z:
            if name not in z.files:
                raise FetchError(f"the output has no member {name!r} (it has {sorted(z.files)})")
            buf = io.BytesIO()
            np.save(buf, z[name], allow_pickle=False)
            return buf.getvalue()
    except (OSError, ValueError) as exc:
        raise FetchError(f"the output is no .npz set, so it has no member {name!r}") from exc


async def fetch(js: Any, ts: TaskStatus, out: str, member: str | None = None) -> int:
    """Write the output of `ts` (one `member` of an `.npz` set) to `out` (`-`: stdout);
    returns the bytes written. A digest that differs leaves nothing at `out`."""
    assert ts.output_key is not None
    try:
        bucket = await js.object_store(subjects.OUTPUTS_BUCKET)
    except BucketNotFoundError as exc:
        raise FetchError("no output has been kept yet (the outputs bucket does not exist)") from exc
    fd, tmp_name = tempfile.mkstemp(prefix=".mars-get-", dir=_tmp_dir(out))
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as fh:
            try:
                await bucket.get(ts.output_key, writeinto=fh)
            except NotFoundError as exc:
                raise FetchError(
                    f"the output of {ts.task_id} is gone from the outputs bucket (past its "
                    "retention, or removed)"
                ) from exc
        return await asyncio.to_thread(_finish, tmp, ts, out, member)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)  # (moved away unless it failed)


def _finish(tmp: Path, ts: TaskStatus, out: str, member: str | None) -> int:
    """Check what was read, take the member asked for, and put it where it was asked."""
    got = sha256_file(tmp)
    if got != ts.output_sha256:
        raise FetchError(f"the output read hashes to {got}, not {ts.output_sha256}: not kept")
    if member is not None:
        tmp.write_bytes(_member(tmp, member))
    size = tmp.stat().st_size
    if out == "-":
        _copy_to_stdout(tmp)
    else:
        os.replace(tmp, out)
    return size


def _tmp_dir(out: str) -> str | None:
    """Beside the destination (so the final move is a rename), or the system's for stdout."""
    if out == "-":
        return None
    parent = Path(out).resolve().parent
    if not parent.is_dir():
        raise FetchError(f"no directory {parent} to write {out} in")
    return str(parent)


def _copy_to_stdout(path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
