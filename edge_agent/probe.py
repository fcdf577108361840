"""What this host really has, read with psutil and measured with a short matmul."""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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


_BLAS_SET = (
    "scipy_openblas_set_num_threads64_",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
_BLAS_GET = (
    "scipy_openblas_get_num_threads64_",
    "openblas_get_num_threads64_",
    "openblas_get_num_threads",
)


def _openblas() -> tuple[Any, Any] | None:
    """(set, get) thread-count functions of the OpenBLAS numpy loaded, if it is one we find."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = {ln.split()[-1] for ln in fh if "openblas" in ln.lower() and "/" in ln}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, s) for s in _BLAS_SET if hasattr(lib, s)), None)
        getter = next((getattr(lib, g) for g in _BLAS_GET if hasattr(lib, g)), None)
        if setter is not None and getter is not None:
            return setter, getter
    return None


@contextlib.contextmanager
def single_thread_blas() -> Iterator[None]:
    """Run BLAS on one thread for a while. Why: a slot runs one task on one core, so per-core
    speed is the figure to advertise, and a multi-threaded matmul of this size is at the mercy
    of thread wake-ups (on a small VM it read 0.3 to 110 GFLOP/s from run to run)."""
    fns = _openblas()
    if fns is None:
        yield
        return
    setter, getter = fns
    before = int(getter())
    setter(1)
    try:
        yield
    finally:
        setter(before)


def matmul_gflops(n: int = 256, repeats: int = 5, min_s: float = 0.04) -> float:
    """Single-core float32 matmul throughput, best of at least `repeats` calls and `min_s`
    seconds: a cheap, honest, repeatable speed figure (the drift re-check compares with it)."""
    with single_thread_blas():
        return _matmul_gflops(n, repeats, min_s)


def _matmul_gflops(n: int, repeats: int, min_s: float) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up
    best = float("inf")
    start = time.perf_counter()
    calls = 0
    while calls < repeats or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
        calls += 1
    return (2.0 * n**3) / max(best, 1e-9) / 1e9
