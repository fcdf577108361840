"""Values on the wire and in executors: bytes with a media type, decoded for the tasks that
take them and encoded from what tasks return. Pure.

A value crosses the wire as bytes (checked by sha256); what they are is its producer's
declared `output_type`, else what its producer's executor made them as (sent with them), else
what the bytes say: `.npy` and `.npz` are recognised by their own headers, anything else is raw
bytes.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # (a python task's own process imports this module: pydantic stays out)
    from schemas.pipeline import InputBinding, MediaType, TaskSpec

BYTES: MediaType = "application/octet-stream"
NPY: MediaType = "application/x-npy"
NPZ: MediaType = "application/x-npz"
JSON: MediaType = "application/json"
TEXT: MediaType = "text/plain"
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"


class BadValue(ValueError):
    """A value that is not what it says it is, or not what its consumer can take."""


def sniff(data: bytes) -> MediaType:
    """What undeclared bytes are: `.npy` or `.npz` by their headers, else raw bytes."""
    if data.startswith(NPY_MAGIC):
        return NPY
    if data.startswith(ZIP_MAGIC):
        return NPZ
    return BYTES


def decode(data: bytes, media_type: MediaType | None = None) -> Any:
    """The value as a task takes it: an array, a dict of arrays, JSON data, text or bytes."""
    kind = media_type or sniff(data)
    try:
        if kind == NPY:
            return np.load(io.BytesIO(data), allow_pickle=False)
        if kind == NPZ:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        if kind == JSON:
            return json.loads(data)
        if kind == TEXT:
            return data.decode("utf-8")
    except (OSError, ValueError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise BadValue(f"not a valid {kind} value ({len(data)} B): {exc}") from exc
    return data


def encode(value: Any, declared: MediaType | None = None) -> tuple[bytes, MediaType]:
    """What a task returned, as bytes and their media type: bytes as they are, an array as
    `.npy`, a dict of arrays as `.npz`, str as text, anything else as JSON. A declared type
    the value cannot be is an error naming both."""
    if isinstance(value, bytes | bytearray | memoryview):
        data, kind = bytes(value), BYTES
    elif isinstance(value, np.ndarray):
        data, kind = npy(value), NPY
    elif (
        isinstance(value, Mapping)
        and value
        and all(isinstance(v, np.ndarray) for v in value.values())
    ):
        data, kind = npz({str(k): v for k, v in value.items()}), NPZ
    elif isinstance(value, str):
        data, kind = value.encode("utf-8"), TEXT
    else:
        try:
            text = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
            data = text.encode()
        except (TypeError, ValueError) as exc:
            raise BadValue(f"a {type(value).__name__} is not JSON-able") from exc
        kind = JSON
    if declared is None or declared in (kind, BYTES):
        return data, declared or kind
    if declared == JSON and kind == TEXT:
        return json.dumps(value).encode(), JSON
    raise BadValue(f"output declared {declared}, but the task made {kind}")


def npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def bindings(task: TaskSpec) -> Sequence[InputBinding]:
    """A task's inputs by name: as declared, else each dep's output under the dep's id."""
    from schemas.pipeline import InputBinding

    return task.inputs or [InputBinding(name=d, source=d) for d in task.deps]


def origin(b: InputBinding) -> str:
    """Where a binding's value is found among a job's values: its producer's id, or `@NAME`
    for the pipeline input NAME."""
    return b.source if b.source is not None else f"@{b.pipeline_input}"


def member(value: Any, name: str, source: str) -> Any:
    if not isinstance(value, dict) or name not in value:
        have = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise BadValue(f"{source}'s output has no member {name!r} (it has {have})")
    return value[name]


def bind(
    task: TaskSpec, got: Mapping[str, bytes], types: Mapping[str, MediaType | None]
) -> dict[str, Any]:
    """Each input of `task`, decoded, under its name (`got`: producer -> its output's bytes;
    `types`: producer -> its media type, declared or as made; None: by its bytes)."""
    out: dict[str, Any] = {}
    for b in bindings(task):
        src = origin(b)
        if src not in got:
            raise BadValue(f"input {b.name}: no value from {src}")
        value = decode(got[src], types.get(src))
        out[b.name] = member(value, b.member, src) if b.member else value
    return out


def raw(
    task: TaskSpec, got: Mapping[str, bytes], types: Mapping[str, MediaType | None]
) -> dict[str, bytes]:
    """Each input of `task` as the bytes it came as (a member of an `.npz` set as `.npy`; of a
    JSON object as JSON), under its name: what an `exec` task gets as files."""
    out: dict[str, bytes] = {}
    for b in bindings(task):
        src = origin(b)
        if src not in got:
            raise BadValue(f"input {b.name}: no value from {src}")
        data = got[src]
        if b.member:
            part = member(decode(data, types.get(src)), b.member, src)
            data = npy(part) if isinstance(part, np.ndarray) else json.dumps(part).encode()
        out[b.name] = data
    return out
