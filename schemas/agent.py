"""What an agent says about itself: devices, links, liveness."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from schemas.artifacts import Sha256Hex
from schemas.base import WireModel
from schemas.limits import (
    MAX_DEVICES,
    MAX_LINKS,
    Count,
    Ident,
    Labels,
    NonNegFloat,
    PosFloat,
    RelativeName,
    ShortText,
)

DeviceKind = Literal["cpu", "gpu", "npu"]
Tier = Literal["device", "edge", "fog", "cloud"]
TaskKind = Literal["synthetic", "onnx", "exec", "python"]


#: Most artifact digests one advert names (a cache holding more names its most recent).
MAX_HELD_ARTIFACTS = 256
#: Most models one advert names warm (an agent with sessions for more names its most
#: recently run).
MAX_WARM_MODELS = 64


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
    #: Logical cores (CPU) as probed; 0 when unknown or not applicable.
    cores: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    #: Clock as probed (MHz); 0 when unknown.
    freq_mhz: NonNegFloat = 0.0
    #: Memory copy bandwidth measured at start (GB/s); 0 when not measured.
    mem_bandwidth_gbps: NonNegFloat = 0.0
    #: Median wall time of one call of the reference ONNX model (ms); 0 when not measured.
    call_overhead_ms: NonNegFloat = 0.0
    #: True only when `gflops` was measured on this host (never for declared/emulated devices).
    calibrated: bool = False


class LinkSpec(WireModel):
    """Measured (or declared) cost of reaching another site from this agent."""

    to_site: Ident
    latency_ms: Annotated[float, Field(ge=0.0, le=600_000.0, allow_inf_nan=False)]
    bandwidth_mbps: Annotated[float, Field(gt=0.0, le=1e7, allow_inf_nan=False)]
    cost_per_gb: NonNegFloat = 0.0
    #: True when the figures come from this agent's own probes (declared otherwise).
    measured: bool = False
    #: Smoothed RTT variation seen by the probes (ms); 0 when declared.
    jitter_ms: NonNegFloat = 0.0


#: A user's public nkey: "U" and 55 base32 characters.
PublicNkey = Annotated[str, StringConstraints(pattern=r"^U[A-Z2-7]{55}$")]


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
    #: The public nkey it connects with (`mars deploy`): a replica believes a connection
    #: advisory about this agent only from a connection the server authenticated as it.
    nkey: PublicNkey | None = None
    #: The sha256 of each artifact its cache holds (the `MAX_HELD_ARTIFACTS` most recently
    #: used, sorted): placement charges the fetch to agents without it.
    artifacts: Annotated[list[Sha256Hex], Field(max_length=MAX_HELD_ARTIFACTS)] = Field(
        default_factory=list
    )
    #: The models it has a live ONNX Runtime session for, as tasks name them
    #: (`OnnxRun.model`; the `MAX_WARM_MODELS` most recently run, sorted): placement charges
    #: a model's load and session creation to agents without it.
    warm_models: Annotated[list[RelativeName], Field(max_length=MAX_WARM_MODELS)] = Field(
        default_factory=list
    )


class CalibrationDrift(WireModel):
    """A measured device got faster or slower than advertised (e.g. thermal throttling); the
    advert already carries the new figure, this says so explicitly for whoever reacts."""

    agent_id: Ident
    incarnation: Ident
    device_id: Ident
    metric: Literal["gflops"] = "gflops"
    #: Figure measured at start, the one advertised until now, and the new one.
    baseline: PosFloat
    previous: PosFloat
    current: PosFloat
    #: current / previous - 1 (e.g. -0.3 for a 30% drop).
    change: Annotated[float, Field(ge=-1.0, le=1e6, allow_inf_nan=False)]


class Heartbeat(WireModel):
    """Kept tiny on purpose: it is sent by every agent several times a second."""

    agent_id: Ident
    incarnation: Ident
    seq: Count
    running: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    draining: bool = False
