"""What is booked, read straight from the bookings bucket (`mars bookings`): the values CAS
arbitrates, whichever orchestrators are up, decoded for people. Read-only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nats.js.errors import (
    BucketNotFoundError,
    InvalidKeyError,
    KeyDeletedError,
    KeyNotFoundError,
)

from orchestrator.infra.kvwatch import all_keys
from orchestrator.reservations.store import BUCKET, device_key_of
from schemas.bookings import BookingWindow, DeviceBookings
from schemas.codec import DecodeError, decode


class NoBookings(Exception):
    """What was asked cannot be read: the bucket (absent: no orchestrator has run here yet),
    or a device name that cannot be one of its keys."""


@dataclass
class KeyBookings:
    """One device's key: its revision (the last booking's fencing token), its size, and its
    windows, or why they could not be read."""

    key: str
    revision: int
    size: int
    windows: list[BookingWindow] = field(default_factory=list)
    problem: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "revision": self.revision,
            "bytes": self.size,
            "windows": [w.model_dump(mode="json") for w in self.windows],
            **({"problem": self.problem} if self.problem else {}),
        }


def key_of(device: str) -> str:
    """A device as the operator names it: its key (`dev.<agent>.<device>`) or its scheduler id
    (`<agent>:<device>`, as `mars status` and `mars agents` show it)."""
    return device if device.startswith("dev.") else device_key_of(device)


async def read_bookings(
    js: Any, device: str | None = None, pipeline: str | None = None, bucket: str = BUCKET
) -> list[KeyBookings]:
    """Every device key (or `device`'s), sorted, with the windows of `pipeline` only when
    given (keys without any then left out). Expired windows are listed too: they stay in a
    key until its next write drops them."""
    try:
        kv = await js.key_value(bucket)
    except BucketNotFoundError as exc:
        raise NoBookings(f"no bucket {bucket}: no orchestrator has booked anything here") from exc
    if device is not None:
        keys: list[str] | None = [key_of(device)]
    else:
        keys = await all_keys(kv)
        if keys is None:
            raise NoBookings(f"{bucket} holds values but listing its keys kept failing")
    out: list[KeyBookings] = []
    for key in sorted(keys or []):
        try:
            entry = await kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):
            continue  # deleted since it was listed, or a device never booked
        except InvalidKeyError as exc:  # only an operator's --device can be one
            raise NoBookings(
                f"not a device: {device!r} (give its key, dev.AGENT.DEVICE, or its id, "
                "AGENT:DEVICE)"
            ) from exc
        data = bytes(entry.value or b"")
        row = KeyBookings(key, entry.revision or 0, len(data))
        try:
            row.windows = decode(data, DeviceBookings).windows
        except DecodeError as exc:
            row.problem = f"undecodable value: {exc.code}: {exc.message}"
        if pipeline is not None:
            row.windows = [w for w in row.windows if w.pipeline_id == pipeline]
            if not row.windows:
                continue
        out.append(row)
    return out
