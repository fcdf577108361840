"""Task executors. Each returns the output bytes and a short human result."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from schemas.agent import DeviceSpec
from schemas.pipeline import OnnxRun, SyntheticRun

BUILTIN_MODELS = Path(__file__).resolve().parent / "models"


class ExecutionError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Output:
    data: bytes
    result: str


def synthetic_seconds(run: SyntheticRun, device: DeviceSpec) -> float:
    """Wall time of a synthetic task on `device`: scaled by speed when a reference is given."""
    if run.ref_gflops is None:
        return run.seconds
    return run.seconds * run.ref_gflops / device.gflops


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


async def run_synthetic(run: SyntheticRun, device: DeviceSpec) -> Output:
    seconds = synthetic_seconds(run, device)
    if run.mode == "sleep":
        await asyncio.sleep(seconds)
    else:
        await asyncio.to_thread(_spin, seconds)
    return Output(bytes(run.output_bytes), f"{run.mode} {seconds:.3f}s")


def resolve_model(name: str, models_dir: str | None) -> Path | None:
    """A model name resolves to a built-in model, then to a file in the agent's models dir."""
    candidates = [BUILTIN_MODELS / f"{name}.onnx", BUILTIN_MODELS / name]
    if models_dir:
        base = Path(models_dir).resolve()
        for cand in (base / name, base / f"{name}.onnx"):
            # never leave the models directory
            if cand.resolve().is_relative_to(base):
                candidates.append(cand)
    for cand in candidates:
        if cand.is_file():
            return cand
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class OnnxExecutor:
    """ONNX Runtime sessions, cached per (model file, provider)."""

    def __init__(self, models_dir: str | None = None) -> None:
        self.models_dir = models_dir
        self._sessions: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()
        #: Runs computing in worker threads now (a terminated one stops being counted when
        #: its thread has returned).
        self.in_flight = 0
        #: Runs terminated before their last iteration (past their limit, or cancelled).
        self.terminated = 0

    def has_model(self, run: OnnxRun) -> str | None:
        """None if runnable, else why not."""
        path = resolve_model(run.model, self.models_dir)
        if path is None:
            return f"model {run.model!r} not found"
        if run.sha256 is not None and sha256_file(path) != run.sha256:
            return f"model {run.model!r} sha256 mismatch"
        return None

    def _session(self, path: Path, provider: str) -> object:
        import onnxruntime as ort

        key = (str(path), provider)
        with self._lock:
            sess = self._sessions.get(key)
            if sess is None:
                available = ort.get_available_providers()
                providers = [provider] if provider in available else []
                if "CPUExecutionProvider" not in providers:
                    providers.append("CPUExecutionProvider")
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 1
                opts.log_severity_level = 3
                sess = ort.InferenceSession(str(path), opts, providers=providers)
                self._sessions[key] = sess
            return sess

    def _run_sync(self, run: OnnxRun, device: DeviceSpec, stop: Any = None) -> Output:
        with self._lock:
            self.in_flight += 1
        try:
            return self._compute(run, device, stop)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _compute(self, run: OnnxRun, device: DeviceSpec, stop: Any) -> Output:
        path = resolve_model(run.model, self.models_dir)
        if path is None:
            raise ExecutionError(f"model {run.model!r} not found")
        sess = self._session(path, device.provider)
        inp = sess.get_inputs()[0]  # type: ignore[attr-defined]
        shape = [run.batch if not isinstance(d, int) or d <= 0 else d for d in inp.shape]
        shape[0] = run.batch
        rng = np.random.default_rng(run.seed)
        x = rng.standard_normal(shape, dtype=np.float32)
        out: np.ndarray = np.empty(0, dtype=np.float32)
        for i in range(run.iterations):
            if stop is not None and stop.terminate:  # between runs; ORT stops inside one
                raise self._terminated(i, run)
            try:
                out = sess.run(None, {inp.name: x}, stop)[0]  # type: ignore[attr-defined]
            except Exception as exc:
                if stop is not None and stop.terminate:
                    raise self._terminated(i, run) from exc
                raise
        top = int(np.argmax(out[0])) if out.ndim >= 2 else int(np.argmax(out))
        return Output(out.astype(np.float32).tobytes(), f"top1=class{top} shape={list(out.shape)}")

    def _terminated(self, done: int, run: OnnxRun) -> ExecutionError:
        with self._lock:
            self.terminated += 1
        return ExecutionError(f"terminated after {done} of {run.iterations} iterations")

    async def run(self, run: OnnxRun, device: DeviceSpec, timeout_s: float = math.inf) -> Output:
        """The run in a worker thread, terminated (ONNX Runtime's `RunOptions.terminate`)
        past `min(run.timeout_s, timeout_s)` or when the task is cancelled: a thread cannot
        be killed, and one left running held the device's compute after its slot was freed."""
        import onnxruntime as ort

        stop = ort.RunOptions()
        limit = min(run.timeout_s, timeout_s)
        work = asyncio.ensure_future(asyncio.to_thread(self._run_sync, run, device, stop))
        try:
            return await asyncio.wait_for(asyncio.shield(work), limit)
        except TimeoutError:
            stop.terminate = True
            how = "terminated"
            try:
                await work  # ends at once: inside a run, or before the next
            except ExecutionError as exc:
                how = str(exc)
            except Exception as exc:
                how = f"terminated ({exc!r})"
            raise ExecutionError(f"onnx run exceeded its {limit:g} s limit; {how}") from None
        except asyncio.CancelledError:
            stop.terminate = True  # withdrawn: the thread stops too, not just its task
            with contextlib.suppress(Exception):
                await work
            raise
