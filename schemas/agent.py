"""What an agent says about itself: devices, links, liveness."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import WireModel
from schemas.limits import (
    MAX_DEVICES,
    MAX_LINKS,
    Count,
    Ident,
    Labels,
    NonNegFloat,
    PosFloat,
    ShortText,
)

DeviceKind = Literal["cpu", "gpu", "npu"]
Tier = Literal["device", "edge", "fog", "cloud"]
TaskKind = Literal["synthetic", "onnx", "exec", "python"]


def default_kinds() -> list[TaskKind]:
    return ["synthetic", "onnx"]


class DeviceSpec(WireModel):
    device_id: Ident
    kind: DeviceKind
    slots: Annotated[int, Field(ge=1, le=1024)] = 1
    memory_mb: NonNegFloat = 0.0
    #: Calibrated throughput in GFLOP/s (or declared, when emulated).
    gflops: PosFloat = 1.0
    provider: ShortText = "CPUExecutionProvider"
    cost_per_hour: NonNegFloat = 0.0
    #: True for devices that exist only in sim or by declaration; never a measurement.
    emulated: bool = False
    model_name: ShortText = ""
    labels: Labels = Field(default_factory=dict)


class LinkSpec(WireModel):
    """Measured (or declared) cost of reaching another site from this agent."""

    to_site: Ident
    latency_ms: Annotated[float, Field(ge=0.0, le=600_000.0, allow_inf_nan=False)]
    bandwidth_mbps: Annotated[float, Field(gt=0.0, le=1e7, allow_inf_nan=False)]
    cost_per_gb: NonNegFloat = 0.0


class AgentAdvert(WireModel):
    agent_id: Ident
    incarnation: Ident
    site: Ident
    tier: Tier
    hostname: ShortText = ""
    labels: Labels = Field(default_factory=dict)
    devices: Annotated[list[DeviceSpec], Field(min_length=1, max_length=MAX_DEVICES)]
    links: Annotated[list[LinkSpec], Field(max_length=MAX_LINKS)] = Field(default_factory=list)
    allowed_kinds: Annotated[list[TaskKind], Field(max_length=4)] = Field(
        default_factory=default_kinds
    )
    heartbeat_interval_s: Annotated[float, Field(gt=0.0, le=60.0)] = 0.5
    version: ShortText = ""
    seq: Count = 0


class Heartbeat(WireModel):
    """Kept tiny on purpose: it is sent by every agent several times a second."""

    agent_id: Ident
    incarnation: Ident
    seq: Count
    running: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    draining: bool = False
