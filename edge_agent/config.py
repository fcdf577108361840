"""Agent configuration file (YAML): what cannot be probed, and what is only emulated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field

from schemas.agent import DeviceSpec, LinkSpec, TaskKind, Tier, default_kinds
from schemas.limits import Ident, Labels


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: Ident | None = None
    site: Ident = "local"
    tier: Tier = "edge"
    labels: Labels = Field(default_factory=dict)
    #: Probe the CPU of this host and advertise it.
    probe_cpu: bool = True
    #: Slots of the probed CPU device (default: logical cores).
    cpu_slots: Annotated[int, Field(ge=1, le=1024)] | None = None
    #: Devices declared by the operator; mark emulated ones `emulated: true`.
    devices: list[DeviceSpec] = Field(default_factory=list)
    #: Declared link costs (measured ones replace these once probing runs).
    links: list[LinkSpec] = Field(default_factory=list)
    allowed_kinds: list[TaskKind] = Field(default_factory=default_kinds)
    heartbeat_interval_s: Annotated[float, Field(gt=0.0, le=60.0)] = 0.5
    #: Directory searched for ONNX model files named in tasks (besides built-in models).
    models_dir: str | None = None


def load_config(path: str | Path) -> AgentConfig:
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: agent config must be a mapping")
    return AgentConfig.model_validate(raw)
