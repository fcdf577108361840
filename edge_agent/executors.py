"""Task executors. Each returns the output bytes and a short human result."""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent import values
from edge_agent.artifacts import ArtifactCache
from schemas.agent import MAX_WARM_MODELS, DeviceSpec
from schemas.artifacts import parse_ref
from schemas.digests import sha256_file
from schemas.pipeline import MediaType, OnnxRun, SyntheticRun

BUILTIN_MODELS = Path(__file__).resolve().parent / "models"


class ExecutionError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Output:
    data: bytes
    result: str
    media_type: MediaType = values.BYTES
    #: An ONNX run's timing, said apart on its end event: the seconds of its model runs
    #: alone (`session.run` calls, timed as the predictor's labels are), the seconds spent
    #: loading the model and creating its session for this run (0 when one was ready), and
    #: whether the session was created for it. None for other executors.
    run_s: float | None = None
    load_s: float | None = None
    cold: bool | None = None


#: ONNX Runtime's element types, as numpy dtypes (the ones a value on the wire may carry).
ORT_DTYPES = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_,
}  # fmt: skip


def feed(name: str, ort_type: str, shape: list[Any], value: Any) -> np.ndarray:
    """An upstream value as the model input `name` takes it; a mismatch of type or shape is a
    task error naming both."""
    if not isinstance(value, np.ndarray):
        raise ExecutionError(
            f"model input {name} takes a tensor {ort_type} {shape}; it was given a "
            f"{type(value).__name__} (bind an .npy value or an .npz member to it)"
        )
    want = ORT_DTYPES.get(ort_type)
    if want is None or value.dtype != np.dtype(want):
        raise ExecutionError(
            f"model input {name} takes {ort_type} {shape}; the value bound to it is "
            f"{value.dtype} {list(value.shape)}"
        )
    fixed = [d if isinstance(d, int) and d > 0 else None for d in shape]
    if len(fixed) != value.ndim or any(
        d is not None and d != got for d, got in zip(fixed, value.shape, strict=True)
    ):
        raise ExecutionError(
            f"model input {name} takes shape {shape}; the value bound to it is "
            f"{value.dtype} {list(value.shape)}"
        )
    return value


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
    builtin = BUILTIN_MODELS.resolve()
    looked = [(builtin, builtin / f"{name}.onnx"), (builtin, builtin / name)]
    if models_dir:
        base = Path(models_dir).resolve()
        looked += [(base, base / name), (base, base / f"{name}.onnx")]
    # never leave the directory (an absolute name or `..` would, joined to it)
    candidates = [cand for base, cand in looked if cand.resolve().is_relative_to(base)]
    for cand in candidates:
        if cand.is_file():
            return cand
    return None


class OnnxExecutor:
    """ONNX Runtime sessions, cached per (model file, provider)."""

    def __init__(
        self, models_dir: str | None = None, artifacts: ArtifactCache | None = None
    ) -> None:
        self.models_dir = models_dir
        #: Where models named `name@sha256` are, once fetched (the agent fetches them before
        #: each run: `ArtifactCache.holding`).
        self.artifacts = artifacts
        self._sessions: dict[tuple[str, str], object] = {}
        #: The models run here whose file has a session, as tasks named them (several names
        #: may share a file), each with its file; the most recently run last. Bounded: a
        #: stream of names for one file (`m`, `./m`, `m.onnx`...) does not grow it.
        self._warm: OrderedDict[str, str] = OrderedDict()
        #: Called when the models `warm_models` names change (a session made, or dropped
        #: with its file), in whatever thread that happened: the agent advertises them.
        self.on_warm_change: Callable[[], None] | None = None
        self._lock = threading.Lock()
        #: Runs computing in worker threads now (a terminated one stops being counted when
        #: its thread has returned).
        self.in_flight = 0
        #: Runs terminated before their last iteration (past their limit, or cancelled).
        self.terminated = 0

    def model_path(self, model: str) -> Path | None:
        """The file of a model: an artifact's from the cache (None until fetched), else
        `resolve_model`'s."""
        ref = parse_ref(model)
        if ref is not None:
            return self.artifacts.cached(ref.sha256) if self.artifacts is not None else None
        return resolve_model(model, self.models_dir)

    def forget(self, path: Path) -> None:
        """Drop the sessions of a model file that is gone (an artifact evicted)."""
        with self._lock:
            for key in [k for k in self._sessions if k[0] == str(path)]:
                del self._sessions[key]
            gone = [m for m, p in self._warm.items() if p == str(path)]
            for m in gone:
                del self._warm[m]
        if gone and self.on_warm_change is not None:
            self.on_warm_change()

    def warm_models(self) -> list[str]:
        """The models (as tasks name them) this executor holds a session for: the
        `MAX_WARM_MODELS` most recently run, sorted (an agent's advert names them)."""
        with self._lock:
            recent = list(self._warm)[-MAX_WARM_MODELS:]
        return sorted(recent)

    def _ran(self, model: str, path: Path) -> None:
        """`model` ran from the session of `path`: warm, the most recently run."""
        with self._lock:
            warm = self._warm
            # said already: among those advertised, with this file (most runs: nothing new)
            said = warm.get(model) == str(path) and (
                len(warm) <= MAX_WARM_MODELS or model in list(warm)[-MAX_WARM_MODELS:]
            )
            warm[model] = str(path)
            warm.move_to_end(model)
            while len(warm) > 4 * MAX_WARM_MODELS:
                warm.popitem(last=False)
        if not said and self.on_warm_change is not None:
            self.on_warm_change()

    def has_model(self, run: OnnxRun) -> str | None:
        """None if runnable, else why not. An artifact is fetched (and verified) before its
        run, not here: admission never waits on the network."""
        if parse_ref(run.model) is not None:
            return None if self.artifacts is not None else "this agent keeps no artifacts"
        path = resolve_model(run.model, self.models_dir)
        if path is None:
            return f"model {run.model!r} not found"
        if run.sha256 is not None and sha256_file(path) != run.sha256:
            return f"model {run.model!r} sha256 mismatch"
        return None

    def _session(self, path: Path, provider: str) -> tuple[object, bool]:
        """The session of a model file on a provider, and whether it was created now."""
        import onnxruntime as ort

        key = (str(path), provider)
        with self._lock:
            sess = self._sessions.get(key)
            created = sess is None
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
            return sess, created

    def _run_sync(
        self,
        run: OnnxRun,
        device: DeviceSpec,
        stop: Any = None,
        given: dict[str, Any] | None = None,
    ) -> Output:
        with self._lock:
            self.in_flight += 1
        try:
            return self._compute(run, device, stop, given or {})
        finally:
            with self._lock:
                self.in_flight -= 1

    def _feeds(self, run: OnnxRun, sess: Any, given: dict[str, Any]) -> dict[str, np.ndarray]:
        """Each model input from the value bound to its name (or the one value given to a
        one-input model), else, where the task asks for it, a seeded random tensor."""
        inputs = sess.get_inputs()
        rng = np.random.default_rng(run.seed)
        out: dict[str, np.ndarray] = {}
        for inp in inputs:
            if inp.name in given:
                value = given[inp.name]
            elif (
                len(inputs) == 1
                and len(given) == 1
                and (
                    isinstance(only := next(iter(given.values())), np.ndarray)
                    or not run.random_inputs
                )
            ):
                value = only  # one value for a one-input model: bound whatever its name
            elif run.random_inputs:
                shape = [run.batch if not isinstance(d, int) or d <= 0 else d for d in inp.shape]
                shape[0] = run.batch
                value = rng.standard_normal(shape).astype(ORT_DTYPES.get(inp.type, np.float32))
            else:
                have = ", ".join(sorted(given)) or "none"
                raise ExecutionError(
                    f"model input {inp.name} ({inp.type} {list(inp.shape)}) has no value bound "
                    f"to it (inputs given: {have}; `random_inputs: true` feeds random ones)"
                )
            out[inp.name] = feed(inp.name, inp.type, list(inp.shape), value)
        return out

    def _compute(
        self, run: OnnxRun, device: DeviceSpec, stop: Any, given: dict[str, Any]
    ) -> Output:
        path = self.model_path(run.model)
        if path is None:
            raise ExecutionError(f"model {run.model!r} not found")
        t0 = time.perf_counter()
        sess: Any
        sess, cold = self._session(path, device.provider)
        load_s = time.perf_counter() - t0 if cold else 0.0
        self._ran(run.model, path)
        feeds = self._feeds(run, sess, given)
        names = [o.name for o in sess.get_outputs()]
        outs: list[np.ndarray] = []
        run_s = 0.0  # the session.run calls alone: no load, input preparation or output
        for i in range(run.iterations):
            if stop is not None and stop.terminate:  # between runs; ORT stops inside one
                raise self._terminated(i, run)
            try:
                t1 = time.perf_counter()
                outs = sess.run(None, feeds, stop)
                run_s += time.perf_counter() - t1
            except Exception as exc:
                if stop is not None and stop.terminate:
                    raise self._terminated(i, run) from exc
                raise
        first = np.asarray(outs[0])
        said = f"{names[0]} {first.dtype} {list(first.shape)}"
        if first.ndim >= 2 and first.shape[0] and np.issubdtype(first.dtype, np.floating):
            said = f"top1=class{int(np.argmax(first[0]))} {said}"  # a classifier's, for people
        if len(outs) == 1:
            data, media = values.npy(first), values.NPY
        else:
            data = values.npz({n: np.asarray(o) for n, o in zip(names, outs, strict=True)})
            media, said = values.NPZ, f"{len(outs)} outputs: {said}, ..."
        return Output(data, said, media, run_s=run_s, load_s=load_s, cold=cold)

    def _terminated(self, done: int, run: OnnxRun) -> ExecutionError:
        with self._lock:
            self.terminated += 1
        return ExecutionError(f"terminated after {done} of {run.iterations} iterations")

    async def run(
        self,
        run: OnnxRun,
        device: DeviceSpec,
        timeout_s: float = math.inf,
        inputs: dict[str, Any] | None = None,
    ) -> Output:
        """The run in a worker thread, terminated (ONNX Runtime's `RunOptions.terminate`)
        past `min(run.timeout_s, timeout_s)` or when the task is cancelled: a thread cannot
        be killed, and one left running held the device's compute after its slot was freed."""
        import onnxruntime as ort

        stop = ort.RunOptions()
        limit = min(run.timeout_s, timeout_s)
        work = asyncio.ensure_future(
            asyncio.to_thread(self._run_sync, run, device, stop, inputs or {})
        )
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
