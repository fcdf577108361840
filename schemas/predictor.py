"""What the predictor keeps in JetStream KV: one correction track per (task signature, device)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.base import WireModel
from schemas.limits import Count, ShortText

Ratio = Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)]


class CorrectionTrack(WireModel):
    """A track's state (orchestrator.predictor.correction.Track) as stored."""

    log_factor: Ratio = 0.0
    n: Count = 0
    recent: Annotated[list[Ratio], Field(max_length=64)] = Field(default_factory=list)
    pending: Annotated[list[Ratio], Field(max_length=64)] = Field(default_factory=list)
    rejected: Count = 0
    updated: Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)] = 0.0


class CorrectionRecord(WireModel):
    """KV bucket `MARS_PREDICTOR`: key `<signature>.<hash of device>`, last writer wins."""

    sig: Annotated[str, Field(min_length=1, max_length=256)]
    device: Annotated[str, Field(min_length=1, max_length=300)]
    track: CorrectionTrack
    by: ShortText = ""
