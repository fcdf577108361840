"""What this host really has, read with psutil and measured with a short matmul."""

from __future__ import annotations

import os
import platform
import socket
import time
from dataclasses import dataclass

import numpy as np
import psutil


@dataclass(frozen=True, slots=True)
class HostFacts:
    hostname: str
    cpu_model: str
    logical_cores: int
    physical_cores: int
    freq_mhz: float
    memory_mb: float


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_host() -> HostFacts:
    freq = psutil.cpu_freq()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    return HostFacts(
        hostname=socket.gethostname(),
        cpu_model=_cpu_model()[:256],
        logical_cores=int(logical),
        physical_cores=int(psutil.cpu_count(logical=False) or logical),
        freq_mhz=float(freq.current) if freq else 0.0,
        memory_mb=psutil.virtual_memory().total / 2**20,
    )


def matmul_gflops(n: int = 256, repeats: int = 5) -> float:
    """Single-call float32 matmul throughput, best of `repeats`: a cheap, honest speed figure."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return (2.0 * n**3) / max(best, 1e-9) / 1e9
