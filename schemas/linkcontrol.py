"""The control protocol of the link emulator (`sim/linkemu.py`): JSON lines on a loopback
port, one request and one reply each. `mars sim link` speaks it to a running fleet."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import WireModel
from schemas.errors import ErrorCode
from schemas.limits import Count, NonNegFloat, PosFloat, ShortText, Text


class LinkProfileFields(WireModel):
    """One-way figures of an emulated link (each direction gets them)."""

    latency_ms: NonNegFloat = 0.0
    jitter_ms: NonNegFloat = 0.0
    #: Per direction; None = unlimited.
    bandwidth_mbps: PosFloat | None = None
    #: Per-segment loss probability, modelled as a retransmission delay.
    loss: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.0


class LinkControl(WireModel):
    op: Literal["cut", "restore", "profile", "show"]
    #: One link by name; None = every link.
    link: ShortText | None = None
    #: For `profile`: the new figures.
    profile: LinkProfileFields | None = None


class LinkStatus(WireModel):
    port: Annotated[int, Field(ge=0, le=65535)]
    cut: bool
    connections: Count
    profile: LinkProfileFields


class LinkControlReply(WireModel):
    ok: bool
    code: ErrorCode | None = None
    error: Text = ""
    links: Annotated[dict[ShortText, LinkStatus], Field(max_length=100_000)] = Field(
        default_factory=dict
    )
