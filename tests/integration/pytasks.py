"""Functions that `python` tasks in tests call, misbehaving on purpose. The task's process
imports this module from the agent's (the test run's) path: allowlist `tests.integration.pytasks`.
"""

from __future__ import annotations

import ctypes
import os
import resource
import time

import numpy as np


def hold(fifo: str) -> str:
    """Say this process's id on `fifo` (a named pipe the test reads), then never end on time."""
    with open(fifo, "w", encoding="utf-8") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)
    return "woke"


def allocate(mib: int) -> int:
    """Fill `mib` MiB of memory."""
    return int(np.ones(mib << 17).size)  # float64: 2**17 of them a MiB


def exit_now(code: int = 3) -> None:
    """End the interpreter at once, as a crashing extension would."""
    os._exit(code)


def segfault() -> None:
    """Read address 0."""
    ctypes.string_at(0)


def where() -> dict[str, object]:
    """What the process sees: its directory, environment, path and resource limits."""
    limits = {
        name: list(resource.getrlimit(getattr(resource, name)))
        for name in ("RLIMIT_DATA", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_CORE")
    }
    return {"cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid(), "limits": limits}


def heavy_imports() -> list[float]:
    """numpy and ONNX Runtime load and compute (they map much virtual memory)."""
    import onnxruntime  # noqa: F401

    a = np.random.default_rng(0).random((256, 256))
    return [float((a @ a).sum() > 0)]
