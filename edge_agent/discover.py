"""What devices this host has: CPU (psutil), NVIDIA GPUs (NVML or `nvidia-smi`), and the
accelerators ONNX Runtime can drive. Parsing and mapping are pure functions so they can be
tested with recorded outputs; the probing wrappers never raise (a missing tool means "none").
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from edge_agent.calibrate import calibrate_device
from edge_agent.config import AgentConfig
from edge_agent.ortprobe import OrtFacts, ort_facts, ort_facts_later
from edge_agent.probe import HostFacts, probe_host
from schemas.agent import DeviceKind, DeviceSpec

log = logging.getLogger("mars.agent.discover")

#: Queried from `nvidia-smi`, in this order.
NVIDIA_SMI_FIELDS = ("index", "name", "memory.total", "uuid", "driver_version", "clocks.max.sm")
NVIDIA_SMI_TIMEOUT_S = 5.0

#: ONNX Runtime providers that drive NVIDIA GPUs, best first for general use (TensorRT builds
#: engines on first use, which is slow to start, so CUDA comes first).
NVIDIA_PROVIDERS = (
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "NvTensorRTRTXExecutionProvider",
)
#: Other accelerator providers and the device kind they stand for. Providers that only speed
#: up the CPU (DNNL, XNNPACK, ACL, ArmNN) and remote ones (Azure) are not devices.
ACCELERATOR_PROVIDERS: dict[str, DeviceKind] = {
    "ROCMExecutionProvider": "gpu",
    "MIGraphXExecutionProvider": "gpu",
    "DmlExecutionProvider": "gpu",
    "WebGpuExecutionProvider": "gpu",
    "OpenVINOExecutionProvider": "npu",
    "QNNExecutionProvider": "npu",
    "CoreMLExecutionProvider": "npu",
    "NnapiExecutionProvider": "npu",
    "VitisAIExecutionProvider": "npu",
    "CANNExecutionProvider": "npu",
    "RknpuExecutionProvider": "npu",
    "SNPEExecutionProvider": "npu",
}
#: Throughput advertised for a GPU whose speed could not be estimated: deliberately low, so the
#: scheduler does not bet on it until the operator declares a figure (config `devices`).
UNKNOWN_GFLOPS = 1.0


@dataclass(frozen=True, slots=True)
class GpuFacts:
    index: int
    name: str
    memory_mb: float
    uuid: str = ""
    driver: str = ""
    max_sm_clock_mhz: float = 0.0
    #: CUDA cores, when NVML reports them (needed for a peak GFLOP/s estimate).
    cores: int = 0

    @property
    def peak_gflops(self) -> float:
        """FP32 peak (2 FLOP per core per cycle); 0 when cores or clock are unknown."""
        return 2.0 * self.cores * self.max_sm_clock_mhz / 1e3


def _num(text: str) -> float:
    """A numeric nvidia-smi field; "[N/A]", "[Not Supported]" and blanks read as 0."""
    try:
        return float(text.strip())
    except ValueError:
        return 0.0


def parse_nvidia_smi(text: str) -> list[GpuFacts]:
    """Parse `nvidia-smi --query-gpu=<NVIDIA_SMI_FIELDS> --format=csv,noheader,nounits`.

    Lines that do not have the expected shape are skipped rather than guessed at.
    """
    gpus: list[GpuFacts] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        parts += [""] * (len(NVIDIA_SMI_FIELDS) - len(parts))
        gpus.append(
            GpuFacts(
                index=int(parts[0]),
                name=parts[1][:256],
                memory_mb=_num(parts[2]),
                uuid=parts[3][:128],
                driver=parts[4][:64],
                max_sm_clock_mhz=_num(parts[5]),
            )
        )
    return gpus


def smi_gpus(run: Callable[..., Any] = subprocess.run) -> list[GpuFacts]:
    """GPUs as `nvidia-smi` lists them; none when the binary is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    cmd = [exe, f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        proc = run(cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("nvidia-smi failed: %s", exc)
        return []
    if proc.returncode != 0:
        log.info("nvidia-smi exited %s: %s", proc.returncode, str(proc.stderr)[:200])
        return []
    return parse_nvidia_smi(str(proc.stdout))


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_gpus() -> list[GpuFacts] | None:
    """GPUs through NVML (package nvidia-ml-py, optional); None when NVML is unavailable, so
    the caller can fall back to `nvidia-smi`."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no device, no permission
        log.info("NVML unavailable: %s", exc)
        return None
    gpus: list[GpuFacts] = []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            cores = clock = 0
            try:
                clock = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
                cores = int(pynvml.nvmlDeviceGetNumGpuCores(h))
            except Exception:  # older drivers/bindings lack these; the speed stays unknown
                pass
            gpus.append(
                GpuFacts(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(h))[:256],
                    memory_mb=float(pynvml.nvmlDeviceGetMemoryInfo(h).total) / 2**20,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h))[:128],
                    driver=driver[:64],
                    max_sm_clock_mhz=float(clock),
                    cores=cores,
                )
            )
    except Exception as exc:
        log.info("NVML query failed: %s", exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return gpus


def probe_gpus() -> list[GpuFacts]:
    """NVML first (richer: core count for a speed estimate), `nvidia-smi` as the fallback."""
    gpus = nvml_gpus()
    return gpus if gpus is not None else smi_gpus()


def ort_providers() -> list[str]:
    """Execution providers of the installed ONNX Runtime; none when it is absent."""
    return ort_facts([]).providers


def cpu_device(facts: HostFacts, slots: int | None) -> DeviceSpec:
    """The host CPU as probed (speed figures are filled in by calibration)."""
    return DeviceSpec(
        device_id="cpu0",
        kind="cpu",
        slots=slots or min(facts.logical_cores, 1024),
        memory_mb=round(facts.memory_mb, 1),
        provider="CPUExecutionProvider",
        model_name=facts.cpu_model,
        cores=facts.logical_cores,
        freq_mhz=round(facts.freq_mhz, 1),
    )


def accelerator_devices(gpus: Sequence[GpuFacts], providers: Iterable[str]) -> list[DeviceSpec]:
    """Physical NVIDIA GPUs joined with the ONNX Runtime provider that can drive them, plus one
    device per other accelerator provider. A GPU without such a provider is still advertised
    (exec/python tasks may use it) with an empty provider, which ONNX runs treat as CPU."""
    available = list(providers)
    nvidia = next((p for p in NVIDIA_PROVIDERS if p in available), "")
    out: list[DeviceSpec] = []
    for g in gpus:
        labels = {"mars/vendor": "nvidia"}
        out.append(
            DeviceSpec(
                device_id=f"gpu{g.index}",
                kind="gpu",
                memory_mb=round(g.memory_mb, 1),
                gflops=round(g.peak_gflops, 1) or UNKNOWN_GFLOPS,
                provider=nvidia,
                model_name=g.name,
                freq_mhz=g.max_sm_clock_mhz,
                cores=g.cores,
                labels=labels,
            )
        )
    if nvidia and not gpus:
        # a CUDA-capable runtime but no NVML/nvidia-smi (e.g. some Jetson images): one GPU
        out.append(DeviceSpec(device_id="gpu0", kind="gpu", provider=nvidia, model_name=nvidia))
    counters: dict[DeviceKind, int] = {"gpu": len(out), "npu": 0}
    for p in available:
        kind = ACCELERATOR_PROVIDERS.get(p)
        if kind is None:
            continue
        out.append(
            DeviceSpec(
                device_id=f"{kind}{counters[kind]}",
                kind=kind,
                gflops=UNKNOWN_GFLOPS,
                provider=p,
                model_name=p.removesuffix("ExecutionProvider"),
            )
        )
        counters[kind] += 1
    return out


def merge_declared(
    probed: Sequence[DeviceSpec], declared: Sequence[DeviceSpec]
) -> list[DeviceSpec]:
    """Probed devices, overridden field by field by a declared device of the same id; other
    declared devices appended. A declared device is never `calibrated` (nothing measured it),
    and an emulated one replaces a probed device entirely (it must not borrow real facts)."""
    out = list(probed)
    index = {d.device_id: i for i, d in enumerate(out)}
    for d in declared:
        if d.calibrated:
            d = d.model_copy(update={"calibrated": False})
        i = index.get(d.device_id)
        if i is None:
            index[d.device_id] = len(out)
            out.append(d)
        elif d.emulated:
            out[i] = d
        else:
            named = {k: getattr(d, k) for k in d.model_fields_set if k != "device_id"}
            out[i] = out[i].model_copy(update={**named, "calibrated": False})
    return out


def build_devices(config: AgentConfig, *, calibrate: bool = True) -> list[DeviceSpec]:
    """Everything this agent advertises: probed devices (calibrated when `calibrate`), then the
    config's declared ones merged in. Raises when nothing is left to advertise."""
    probed: list[DeviceSpec] = []
    measure = ["CPUExecutionProvider"] if calibrate and config.probe_cpu else []
    # one look at ONNX Runtime (in a child, while the benchmarks below run here) serves both
    # the provider list and the call-overhead benchmark
    pending = ort_facts_later(measure) if measure or config.probe_accelerators else OrtFacts
    if config.probe_cpu:
        cpu = cpu_device(probe_host(), config.cpu_slots)
        if calibrate:
            provider = cpu.provider
            cpu = calibrate_device(cpu, lambda: pending().call_overhead_ms.get(provider, 0.0))
        probed.append(cpu)
    ort = pending()
    if config.probe_gpus or config.probe_accelerators:
        gpus = probe_gpus() if config.probe_gpus else []
        providers = ort.providers if config.probe_accelerators else []
        probed.extend(accelerator_devices(gpus, providers))
    declared_speed = {d.device_id for d in config.devices if "gflops" in d.model_fields_set}
    for d in probed:
        if d.kind != "cpu" and d.device_id not in declared_speed:
            log.warning(
                "%s (%s): speed not measured; declare its gflops in the agent config",
                d.device_id,
                d.model_name,
            )
    devices = merge_declared(probed, config.devices)
    if not devices:
        raise ValueError("agent has no devices: enable probe_cpu or declare devices")
    return priced(devices, config)


def priced(devices: Sequence[DeviceSpec], config: AgentConfig) -> list[DeviceSpec]:
    """The devices with the config's agent-wide `cost_per_hour` on each that does not
    declare its own price."""
    if config.cost_per_hour is None:
        return list(devices)
    own = {d.device_id for d in config.devices if "cost_per_hour" in d.model_fields_set}
    return [
        d if d.device_id in own else d.model_copy(update={"cost_per_hour": config.cost_per_hour})
        for d in devices
    ]
