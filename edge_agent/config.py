"""Agent configuration file (YAML): what cannot be probed, and what is only emulated."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.allowlist import ExecRule, ModuleName
from schemas.agent import DeviceSpec, LinkSpec, TaskKind, Tier, default_kinds
from schemas.limits import MAX_PROBE_BYTES, Ident, Labels, NonNegFloat
from schemas.presence import DEFAULT_HEARTBEAT_S


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
    #: Look for NVIDIA GPUs (NVML, else `nvidia-smi`) and advertise them.
    probe_gpus: bool = True
    #: Advertise ONNX Runtime accelerator providers (ROCm, OpenVINO, QNN, ...) as gpu/npu devices.
    probe_accelerators: bool = True
    #: Re-measure calibrated GFLOP/s this often (seconds, jittered); 0 disables.
    recalibrate_every_s: Annotated[float, Field(ge=0.0, le=86_400.0)] = 300.0
    #: Relative change of GFLOP/s that counts as drift (re-advertised and reported).
    drift_threshold: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.15
    #: Probe RTT/bandwidth to peers this often (seconds, jittered); 0 disables.
    link_probe_every_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 10.0
    #: Probe budget per round: at most this many peers ...
    link_probe_max_peers: Annotated[int, Field(ge=1, le=64)] = 4
    #: ... at most this many per destination site ...
    link_probe_per_site: Annotated[int, Field(ge=1, le=8)] = 1
    #: ... and at most this many payload bytes in all.
    link_probe_budget_bytes: Annotated[int, Field(ge=1024, le=64 << 20)] = 1 << 20
    #: Payload of the bandwidth probe.
    link_probe_bytes: Annotated[int, Field(ge=1024, le=MAX_PROBE_BYTES)] = 256 * 1024
    #: Devices declared by the operator; mark emulated ones `emulated: true`. A declared device
    #: with the id of a probed one overrides the fields it names.
    devices: list[DeviceSpec] = Field(default_factory=list)
    #: Price of this host's devices, in dollars per hour of a device's time (what a plan is
    #: charged for the tasks it runs here): every device that does not name its own
    #: `cost_per_hour` (in `devices`) is advertised at it. None: each device's own (0: free).
    cost_per_hour: NonNegFloat | None = None
    #: Declared links to other sites: latency, bandwidth and `cost_per_gb` (dollars per GB
    #: sent there, e.g. cloud egress). Measured latency and bandwidth replace the declared
    #: ones once probing runs; the price stays as declared.
    links: list[LinkSpec] = Field(default_factory=list)
    allowed_kinds: list[TaskKind] = Field(default_factory=default_kinds)
    #: A sparse backstop: a crash or a silent link is found by the server (its connection
    #: closes, or stops answering its pings: `schemas.presence`, docs/recovery.md), not here.
    heartbeat_interval_s: Annotated[float, Field(gt=0.0, le=60.0)] = DEFAULT_HEARTBEAT_S
    #: A task's `started` event is sent once it has run this long; one that ends sooner is
    #: reported once, by its end event (half the events of short tasks). 0: at once.
    started_event_after_s: Annotated[float, Field(ge=0.0, le=60.0)] = 0.05
    #: Directory searched for ONNX model files named in tasks (besides built-in models).
    models_dir: str | None = None
    #: Journal of unsent task events and spilled outputs; set it to survive a restart
    #: (default: a fresh temp dir per process, removed on stop).
    buffer_dir: str | None = None
    #: Bound on the event journal; beyond it new events are sent best-effort only.
    buffer_max_bytes: Annotated[int, Field(ge=4096, le=1 << 40)] = 64 << 20
    #: fsync every journal append (power-loss safe; slower on SD cards).
    buffer_fsync: bool = False
    #: Outputs above this go through the JetStream object store instead of inline.
    object_threshold_bytes: Annotated[int, Field(ge=0, le=1 << 20)] = 512 << 10
    #: Chunks of such an output in the object store (a message each; at most the 1 MiB
    #: a default nats-server takes): bigger chunks cost the sender and receiver less.
    object_chunk_bytes: Annotated[int, Field(ge=1024, le=1 << 20)] = 1 << 20
    #: Limits of the data bucket when this agent creates it.
    object_ttl_s: Annotated[float, Field(gt=0.0, le=30 * 86_400.0)] = 3600.0
    #: How long the outputs of tasks run here stay fetchable (`mars get`): the age limit of
    #: the outputs bucket when this agent makes it (as the pipelines' default retention).
    output_keep_s: Annotated[float, Field(gt=0.0, le=30 * 86_400.0)] = 86_400.0
    object_max_bytes: Annotated[int, Field(ge=1 << 20, le=1 << 50)] = 1 << 30
    #: Outputs kept until every consumer acknowledged: memory first, then spilled to disk.
    retain_memory_bytes: Annotated[int, Field(ge=0, le=1 << 40)] = 32 << 20
    retain_max_bytes: Annotated[int, Field(ge=0, le=1 << 50)] = 1 << 30
    retain_max_age_s: Annotated[float, Field(gt=0.0, le=30 * 86_400.0)] = 3600.0
    #: Reconnect backoff: jittered, doubling from base up to max, so a fleet never stampedes.
    reconnect_base_s: Annotated[float, Field(gt=0.0, le=60.0)] = 0.25
    reconnect_max_s: Annotated[float, Field(gt=0.0, le=600.0)] = 8.0
    #: Executables `exec` tasks may run (argv only, never a shell); see docs/operations.md.
    exec_allow: Annotated[list[ExecRule], Field(max_length=256)] = Field(default_factory=list)
    #: Cap on an exec task's timeout (its own `timeout_s` applies when shorter).
    exec_timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 300.0
    #: Stdout kept per exec task; more kills the process and fails the task.
    exec_max_output_bytes: Annotated[int, Field(ge=0, le=1 << 30)] = 1 << 20
    #: Parent of the per-task working directories (default: the system temp dir).
    exec_work_dir: str | None = None
    #: Modules (or package prefixes) whose public functions `python` tasks may call.
    python_allow: Annotated[list[ModuleName], Field(max_length=256)] = Field(default_factory=list)
    #: Cap on an onnx task's timeout (ONNX Runtime terminates the run).
    onnx_timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 300.0
    #: Cap on a python task's timeout.
    python_timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 300.0
    #: Largest output a python task may return.
    python_max_output_bytes: Annotated[int, Field(ge=0, le=1 << 30)] = 1 << 20
    #: Memory a python task's process may allocate, in MiB (`RLIMIT_DATA`: heap and private
    #: mappings, not the libraries it maps); past it allocations fail and so does the task.
    #: null: no limit.
    python_memory_mb: Annotated[int, Field(ge=64, le=1 << 30)] | None = 4096
    #: Where artifacts tasks name (`name@sha256`) are kept once fetched (default: `artifacts`
    #: in the agent's state directory, `buffer_dir`/<id>, else a temp dir removed on stop).
    artifact_cache_dir: str | None = None
    #: Bound on what that directory keeps: past it the least recently used go (never one a
    #: running task holds); an artifact larger than this is refused.
    artifact_cache_max_bytes: Annotated[int, Field(ge=0, le=1 << 50)] = 2 << 30
    #: Longest one artifact's fetch may take.
    artifact_fetch_timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 300.0
    #: Run `python` tasks whose code is shipped with them (`bundle: name@sha256`), in a
    #: process of their own with this agent's rights. Off: such a task is refused
    #: (`not_allowlisted`, saying why).
    allow_shipped_code: bool = False
    #: On SIGTERM: how long running work may finish before it is cancelled.
    shutdown_grace_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 20.0


def load_config(path: str | Path) -> AgentConfig:
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: agent config must be a mapping")
    return AgentConfig.model_validate(raw)
