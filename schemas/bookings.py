"""What a device's reservation key in JetStream KV holds."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.base import WireModel
from schemas.limits import Ident, ShortText

#: Seconds on the orchestrators' shared booking clock (Unix time).
Instant = Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)]


class BookingWindow(WireModel):
    pipeline_id: Ident
    task_id: Ident
    slot: Annotated[int, Field(ge=0, le=1024)]
    start: Instant
    end: Instant
    #: Dropped by the next writer after this instant unless renewed.
    expires: Instant
    owner: ShortText = ""
    priority: Annotated[int, Field(ge=0, le=1000)] = 100
    preemptible: bool = False
    #: When the pipeline was submitted (for aging).
    submitted: Instant = 0.0
    #: How many of this task's earlier windows were taken by evictions (each one makes this
    #: window rank higher against the next: a task is not evicted over and over).
    evictions: Annotated[int, Field(ge=0, le=1000)] = 0


class DeviceBookings(WireModel):
    device: Annotated[str, Field(min_length=1, max_length=300)]
    windows: Annotated[list[BookingWindow], Field(max_length=20_000)] = Field(default_factory=list)
