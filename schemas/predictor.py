"""What the predictor keeps in JetStream KV: one correction track per (task signature, device)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.base import WireModel
from schemas.limits import Count, ShortText

Ratio = Annotated[float, Field(ge=-1e6, le=1e6, allow_inf_nan=False)]
PositiveRatio = Annotated[float, Field(gt=0.0, le=1e6, allow_inf_nan=False)]
#: A run's or a load's seconds.
Seconds = Annotated[float, Field(ge=0.0, le=1e9, allow_inf_nan=False)]
RunSeconds = Annotated[float, Field(gt=0.0, le=1e9, allow_inf_nan=False)]


class CorrectionTrack(WireModel):
    """A track's state (orchestrator.predictor.correction.Track) as stored."""

    log_factor: Ratio = 0.0
    n: Count = 0
    recent: Annotated[list[Ratio], Field(max_length=64)] = Field(default_factory=list)
    pending: Annotated[list[Ratio], Field(max_length=64)] = Field(default_factory=list)
    rejected: Count = 0
    updated: Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)] = 0.0
    #: Added with history first (a record without them, written before, still loads: its
    #: track starts its history afresh): the last warm run times and their robust centre,
    #: and the cold runs' count, average run time and average load, kept apart.
    warm: Annotated[list[RunSeconds], Field(max_length=64)] = Field(default_factory=list)
    warm_s: Seconds = 0.0
    cold_n: Count = 0
    cold_s: Seconds = 0.0
    load_s: Seconds = 0.0
    #: Added with contention kept apart (a record without them still loads): the last
    #: ratios of runs that shared their agent to the uncontended estimate, and their count.
    contended: Annotated[list[PositiveRatio], Field(max_length=64)] = Field(default_factory=list)
    contended_n: Count = 0


class CorrectionRecord(WireModel):
    """KV bucket `MARS_PREDICTOR`: key `<signature>.<hash of device>`, last writer wins."""

    sig: Annotated[str, Field(min_length=1, max_length=256)]
    device: Annotated[str, Field(min_length=1, max_length=300)]
    track: CorrectionTrack
    by: ShortText = ""
