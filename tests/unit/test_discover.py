"""Discovery: nvidia-smi parsing, provider mapping, declared/probed merging, and this host."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from edge_agent.config import AgentConfig
from edge_agent.discover import (
    UNKNOWN_GFLOPS,
    GpuFacts,
    accelerator_devices,
    build_devices,
    merge_declared,
    ort_providers,
    parse_nvidia_smi,
    smi_gpus,
)
from edge_agent.ortprobe import OrtFacts, parse_facts
from schemas.agent import DeviceSpec

# SAMPLE (not from this machine, which has no GPU): the shape `nvidia-smi
# --query-gpu=index,name,memory.total,uuid,driver_version,clocks.max.sm
# --format=csv,noheader,nounits` prints on a two-GPU host, including a field the driver
# reports as "[N/A]" and a trailing blank line.
NVIDIA_SMI_SAMPLE = """\
0, NVIDIA H100 80GB HBM3, 81559, GPU-6f5b8c1e-2d3a-4b7c-9e0f-112233445566, 550.54.15, 1980
1, NVIDIA A2, 15356, GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9, 550.54.15, [N/A]

"""


def test_parse_nvidia_smi_sample() -> None:
    g0, g1 = parse_nvidia_smi(NVIDIA_SMI_SAMPLE)
    assert g0 == GpuFacts(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        memory_mb=81559.0,
        uuid="GPU-6f5b8c1e-2d3a-4b7c-9e0f-112233445566",
        driver="550.54.15",
        max_sm_clock_mhz=1980.0,
    )
    assert g1.index == 1 and g1.name == "NVIDIA A2" and g1.memory_mb == 15356.0
    assert g1.max_sm_clock_mhz == 0.0  # "[N/A]" is unknown, not an error
    assert g0.peak_gflops == 0.0  # nvidia-smi does not report cores: speed unknown


def test_parse_nvidia_smi_skips_what_it_cannot_read() -> None:
    text = "index, name, memory.total [MiB]\nNo devices were found\n,,\n2, T4, 15360\n"
    (gpu,) = parse_nvidia_smi(text)
    assert (gpu.index, gpu.name, gpu.memory_mb, gpu.uuid) == (2, "T4", 15360.0, "")


def test_smi_gpus_runs_the_query_only_when_the_binary_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, NVIDIA_SMI_SAMPLE, "")

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert smi_gpus(run) == [] and calls == []
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert [g.index for g in smi_gpus(run)] == [0, 1]
    assert calls[0][1].startswith("--query-gpu=index,name,memory.total")
    assert calls[0][2] == "--format=csv,noheader,nounits"

    def failing(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 9, "", "NVIDIA-SMI has failed")

    assert smi_gpus(failing) == []


def test_nvidia_gpus_join_the_cuda_provider_and_cpu_providers_are_not_devices() -> None:
    gpus = parse_nvidia_smi(NVIDIA_SMI_SAMPLE)
    rich = GpuFacts(index=0, name="X", memory_mb=1024.0, max_sm_clock_mhz=1500.0, cores=1000)
    providers = [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
        "AzureExecutionProvider",
        "DnnlExecutionProvider",
    ]
    devs = accelerator_devices(gpus, providers)
    assert [(d.device_id, d.kind, d.provider) for d in devs] == [
        ("gpu0", "gpu", "CUDAExecutionProvider"),
        ("gpu1", "gpu", "CUDAExecutionProvider"),
    ]
    assert devs[0].memory_mb == 81559.0 and devs[0].model_name == "NVIDIA H100 80GB HBM3"
    assert devs[0].gflops == UNKNOWN_GFLOPS and not devs[0].calibrated
    assert devs[0].labels == {"mars/vendor": "nvidia"}
    (est,) = accelerator_devices([rich], [])
    assert est.gflops == pytest.approx(2 * 1000 * 1500 / 1e3)  # NVML peak estimate
    assert est.provider == ""  # a GPU ONNX Runtime cannot drive: no provider claimed


def test_other_accelerator_providers_become_gpu_and_npu_devices() -> None:
    devs = accelerator_devices(
        [], ["OpenVINOExecutionProvider", "ROCMExecutionProvider", "QNNExecutionProvider"]
    )
    assert [(d.device_id, d.kind, d.provider) for d in devs] == [
        ("npu0", "npu", "OpenVINOExecutionProvider"),
        ("gpu0", "gpu", "ROCMExecutionProvider"),
        ("npu1", "npu", "QNNExecutionProvider"),
    ]
    (cuda_only,) = accelerator_devices([], ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert (cuda_only.device_id, cuda_only.provider) == ("gpu0", "CUDAExecutionProvider")
    assert accelerator_devices([], ["CPUExecutionProvider", "AzureExecutionProvider"]) == []


def test_declared_devices_override_named_fields_and_are_never_calibrated() -> None:
    probed = [
        DeviceSpec(device_id="cpu0", kind="cpu", gflops=50.0, calibrated=True),
        DeviceSpec(device_id="gpu0", kind="gpu", memory_mb=81559.0, model_name="H100"),
    ]
    declared = [
        DeviceSpec(device_id="gpu0", kind="gpu", gflops=40_000.0),
        DeviceSpec(device_id="npu0", kind="npu", gflops=80.0, emulated=True),
        DeviceSpec(device_id="fpga0", kind="npu", gflops=10.0, calibrated=True),
        DeviceSpec(device_id="cpu0", kind="cpu", gflops=7.0, emulated=True),
    ]
    out = {d.device_id: d for d in merge_declared(probed, declared)}
    assert list(out) == ["cpu0", "gpu0", "npu0", "fpga0"]
    gpu = out["gpu0"]
    assert (gpu.gflops, gpu.memory_mb, gpu.model_name) == (40_000.0, 81559.0, "H100")
    assert out["npu0"].emulated and not out["npu0"].calibrated
    assert not out["fpga0"].calibrated  # a config cannot claim a measurement
    # an emulated declaration replaces the probed device entirely: no borrowed measurement
    assert out["cpu0"] == declared[3]


def test_probed_cpu_matches_this_host() -> None:
    cfg = AgentConfig(probe_gpus=False, probe_accelerators=False)
    (cpu,) = build_devices(cfg, calibrate=False)
    assert cpu.device_id == "cpu0" and cpu.kind == "cpu" and not cpu.emulated
    assert cpu.cores == psutil.cpu_count(logical=True) == cpu.slots
    total_mb = psutil.virtual_memory().total / 2**20
    assert abs(cpu.memory_mb - total_mb) <= 0.01 * total_mb
    assert not cpu.calibrated and cpu.mem_bandwidth_gbps == 0.0  # nothing measured yet


def test_calibrated_build_measures_only_the_probed_cpu() -> None:
    cfg = AgentConfig.model_validate(
        {
            "cpu_slots": 1,
            "devices": [
                {"device_id": "npu0", "kind": "npu", "gflops": 80.0, "emulated": True},
            ],
        }
    )
    t0 = time.perf_counter()
    devices = build_devices(cfg)
    elapsed = time.perf_counter() - t0
    cpu, npu = devices[0], devices[-1]
    assert cpu.calibrated and cpu.slots == 1
    assert cpu.gflops > 0.5 and cpu.mem_bandwidth_gbps > 0.1 and 0 < cpu.call_overhead_ms < 100
    assert npu.emulated and not npu.calibrated and npu.gflops == 80.0
    assert npu.mem_bandwidth_gbps == 0.0 and npu.call_overhead_ms == 0.0
    assert elapsed < 5.0, f"start-up calibration took {elapsed:.2f}s"


def test_onnxruntime_providers_are_listed() -> None:
    assert "CPUExecutionProvider" in ort_providers()


def test_no_devices_is_an_error() -> None:
    cfg = AgentConfig(probe_cpu=False, probe_gpus=False, probe_accelerators=False)
    with pytest.raises(ValueError, match="no devices"):
        build_devices(cfg, calibrate=False)


def test_onnxruntime_child_probe_reports_providers_and_call_overhead() -> None:
    # the agent runs this in a child so that onnxruntime never loads into an idle agent
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent.ortprobe", "--measure=CPUExecutionProvider"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    facts = parse_facts(proc.stdout)
    assert "CPUExecutionProvider" in facts.providers
    assert 0.0 < facts.call_overhead_ms["CPUExecutionProvider"] < 100.0


def test_malformed_child_output_reads_as_nothing_found() -> None:
    assert parse_facts("") == OrtFacts()
    assert parse_facts("Segmentation fault\n") == OrtFacts()
    assert parse_facts('{"providers": 5}') == OrtFacts()
    odd = parse_facts('{"providers": ["A"], "call_overhead_ms": {"A": -1, "B": "x", "C": 2}}')
    assert odd == OrtFacts(["A"], {"C": 2.0})
