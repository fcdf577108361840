"""The predictor at run time: learned model where it applies, roofline prior elsewhere, times the
online correction; one ONNX Runtime call per batch of (task, device) pairs.

Sources, per (task, device):
* `declared`: synthetic tasks state their time (scaled by speed), and tasks that declare only
  `est_seconds`; nothing to learn from a graph;
* `model`: ONNX tasks whose graph features are known, on devices of a (kind, provider) the model
  was trained on and that are really there (not emulated);
* `prior`: everything else: the roofline on graph features, scaled by the median measured
  ratio (so it is unbiased on the hardware we measured), or the declared-FLOPs prior.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from orchestrator.predictor.correction import Corrections
from orchestrator.predictor.features import (
    FEATURE_NAMES,
    DeviceFacts,
    FeatureBook,
    GraphFeatures,
    device_facts,
    device_vector,
    shipped_book,
    task_vector,
)
from orchestrator.predictor.prior import estimate_matrix
from schemas.agent import DeviceSpec
from schemas.pipeline import OnnxRun, Profile, TaskSpec

MODEL_FILE = Path(__file__).resolve().parent / "predictor.onnx"
SOURCES = ("declared", "prior", "model", "history")
DECLARED, PRIOR, MODEL, HISTORY = 0, 1, 2, 3
#: Band of a prior on hardware never measured: a factor of 3 either way (a guess, said so).
UNSEEN_BAND = (-math.log(3.0), math.log(3.0))
#: Cached base figures per (task signature, device set): bytes of their rows (4 floats per
#: device) kept, the least recently used dropped first. 64 MiB holds ~20,000 signatures on
#: 100 devices, ~2,000 on 1,000. (A bound of 4,096 entries, whatever their size, let the
#: placement benchmark's 5,120 distinct task signatures miss on every plan.)
CACHE_BYTES = 64 << 20
#: Device sets remembered (figures as arrays, cached estimates): every single device a
#: duration is reported for is a set of its own, so this is sized for a fleet.
MAX_DEVICE_TABLES = 4096
#: A cold start's load (reading the model, creating its ONNX Runtime session) where none was
#: reported for the task on the device: this, plus the model's bytes at LOAD_PRIOR_BPS. A
#: prior, said so: on the 2-core development host a small model's session took 0.5-5 ms
#: (the first in a process the most), a 3.5 MB one 5-8 ms and a 17 MB one 7-37 ms.
LOAD_PRIOR_S = 0.005
LOAD_PRIOR_BPS = 500e6
#: Model sizes remembered per (name, pinned digest) for the load prior.
MAX_MODEL_SIZES = 4096
F64 = NDArray[np.float64]


def task_signature(task: TaskSpec) -> str:
    """What makes two tasks the same work: their run and profile, not their id or deps."""
    run, profile = task.run, task.profile
    # the bytes of model_dump_json(), without its wrapper's cost (every plan signs every task)
    raw = type(run).__pydantic_serializer__.to_json(run) + Profile.__pydantic_serializer__.to_json(
        profile
    )
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Estimates:
    """Per (task, device): corrected seconds, the uncorrected base, the band and the source."""

    seconds: F64
    base: F64
    lo: F64
    hi: F64
    source: NDArray[np.int8]
    factor: F64

    def source_name(self, i: int, j: int) -> str:
        return SOURCES[int(self.source[i, j])]


@dataclass(frozen=True)
class _DeviceTable:
    """A device set's figures as arrays, computed once per set."""

    gflops: F64
    mem_gbps: F64
    overhead: F64
    vectors: NDArray[np.float32]
    ok: NDArray[np.bool_]
    #: indices of the devices the model applies to, and their feature vectors already
    #: clipped to the model's training range (the device half of every row it scores)
    cols: NDArray[np.intp]
    clipped: NDArray[np.float32]
    #: whether `cols` is every device (then whole rows are written, not gathered ones)
    every: bool
    band_lo: F64
    band_hi: F64


class LearnedModel:
    """The shipped ONNX regressor and what its metadata says about where it applies."""

    def __init__(self, path: Path = MODEL_FILE) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map
        if tuple(json.loads(meta["features"])) != FEATURE_NAMES:
            raise ValueError(f"{path} was trained on another feature vector")
        self.seen = {(k, p) for k, p in json.loads(meta["seen"])}
        self.band_model = json.loads(meta["band_model"])
        self.band_prior = json.loads(meta["band_prior"])
        self.prior_log_scale = float(meta.get("prior_log_scale", "0"))
        self.lo = np.asarray(json.loads(meta["feature_min"]), dtype=np.float32)
        self.hi = np.asarray(json.loads(meta["feature_max"]), dtype=np.float32)

    def applies(self, d: DeviceFacts) -> bool:
        return not d.emulated and (d.kind, d.provider) in self.seen

    def run(
        self, x: NDArray[np.float32], log_roof: NDArray[np.float32], *, clipped: bool = False
    ) -> F64:
        """Seconds per call for each row; features clipped to the training range (beyond it
        the roofline alone carries the scale; `clipped`: the caller already did)."""
        xc = x if clipped else np.clip(x, self.lo, self.hi)
        out = self.session.run(["seconds"], {"x": xc, "log_roofline": log_roof.reshape(-1, 1)})
        return np.asarray(out[0], dtype=np.float64)[:, 0]


@cache
def shipped_model() -> LearnedModel | None:
    return LearnedModel() if MODEL_FILE.exists() else None


class Predictor:
    """Scores tasks on devices; keeps the online corrections. Cheap to call repeatedly: base
    figures are cached per (task signature, device set), corrections applied on top."""

    def __init__(
        self,
        model: LearnedModel | None = None,
        book: FeatureBook | None = None,
        corrections: Corrections | None = None,
        *,
        use_model: bool = True,
    ) -> None:
        self.model = model if model is not None else (shipped_model() if use_model else None)
        self.book = book if book is not None else shipped_book()
        self.corrections = corrections if corrections is not None else Corrections()
        #: Device sets (device keys and spec object ids) as small ints, hashed once per call
        #: instead of once per task; `_set_devices` keeps the specs alive, so the id()s in the
        #: keys stay theirs. Cache and tables are keyed by those ints.
        self._set_ids: dict[tuple[Any, ...], int] = {}
        self._set_devices: dict[int, Sequence[DeviceSpec]] = {}
        self._cache: OrderedDict[tuple[str, int], F64] = OrderedDict()
        self._cache_bytes = 0
        #: (task, device set) pairs scored (cache misses), for tests and tuning.
        self.scored = 0
        self._tables: dict[int, _DeviceTable] = {}
        self.ort_calls = 0
        #: Bytes of each model's weights (float32) as its graph features say.
        self._model_bytes: dict[tuple[str, str | None], float] = {}

    # -- features ---------------------------------------------------------------------------
    def graph_of(self, task: TaskSpec) -> GraphFeatures | None:
        run = task.run
        if not isinstance(run, OnnxRun):
            return None
        return self.book.get(run.model, run.batch, run.sha256)

    # -- scoring ----------------------------------------------------------------------------
    def estimate(
        self,
        tasks: Sequence[TaskSpec],
        devices: Sequence[DeviceSpec],
        keys: Sequence[str] | None = None,
        tiers: Sequence[str] | None = None,
    ) -> Estimates:
        """Every task on every device; `keys` name the devices for the corrections (default:
        their device ids). One ONNX Runtime call for everything not cached."""
        keys = list(keys) if keys is not None else [d.device_id for d in devices]
        set_id = self._set_id(tuple(zip(keys, map(id, devices), strict=True)), devices)
        # not memoised: a signature takes ~1.5 us, and a memo per task object kept up to 2,048
        # tasks' specs alive for every young garbage collection of the orchestrator to visit
        sigs = [task_signature(t) for t in tasks]
        nt, nd = len(tasks), len(devices)
        out = np.empty((4, nt, nd))  # base, lo, hi, source
        todo: list[int] = []
        cache = self._cache
        for i, s in enumerate(sigs):
            hit = cache.get((s, set_id))
            if hit is None:
                todo.append(i)
            else:
                out[:, i] = hit
                cache.move_to_end((s, set_id))
        if todo:
            table = self._devices(set_id, devices, tiers)
            self._score([tasks[i] for i in todo], table, out, todo)
            self.scored += len(todo)
            for i in todo:
                key = (sigs[i], set_id)
                old = cache.get(key)  # the same signature twice in one call
                if old is not None:
                    self._cache_bytes -= old.nbytes
                row = cache[key] = out[:, i].copy()
                self._cache_bytes += row.nbytes
            while self._cache_bytes > CACHE_BYTES and cache:
                self._cache_bytes -= cache.popitem(last=False)[1].nbytes
        base, lo, hi = out[0], out[1], out[2]
        src = out[3].astype(np.int8)
        factor = np.ones((nt, nd))
        if len(self.corrections):
            col = {k: j for j, k in enumerate(keys)}
            for i, s in enumerate(sigs):
                for k, tr in self.corrections.for_signature(s).items():
                    j = col.get(k)
                    if j is None:
                        continue
                    if tr.warm_s > 0.0 and base[i, j] > 0.0:  # history first
                        factor[i, j] = tr.warm_s / base[i, j]
                        src[i, j] = HISTORY
                    else:
                        factor[i, j] = tr.factor
        return Estimates(base * factor, base, lo * factor, hi * factor, src, factor)

    def load_estimate(self, task: TaskSpec, key: str) -> float | None:
        """Seconds a cold start of `task` on device `key` spends loading its model and making
        its session, from the cold runs reported there; None before any."""
        tr = self.corrections.get(task_signature(task), key)
        return tr.load_s if tr is not None and tr.cold_n else None

    def contention(self, task: TaskSpec, key: str) -> float | None:
        """How much slower than uncontended `task` ran on device `key` when its agent ran
        other jobs at the same time: the median ratio of those runs' times to the
        uncontended estimate then; None before any such run. Not used by planning yet."""
        tr = self.corrections.get(task_signature(task), key)
        return tr.contention if tr is not None else None

    def load_prior(self, task: TaskSpec, nbytes: float | None = None) -> float:
        """A cold start's load where none was reported: `LOAD_PRIOR_S` plus the model's
        bytes (`nbytes`, e.g. its artifact's size; else its weights as its graph features
        count them; else none) at `LOAD_PRIOR_BPS`. 0 for a task that loads no model."""
        run = task.run
        if not isinstance(run, OnnxRun):
            return 0.0
        if nbytes is None:
            key = (run.model, run.sha256)
            nbytes = self._model_bytes.get(key)
            if nbytes is None:
                g = self.book.get(run.model, 1, run.sha256)
                nbytes = 0.0  # (not kept: an artifact's features may be added to the book)
                if g is not None:
                    if len(self._model_bytes) >= MAX_MODEL_SIZES:
                        self._model_bytes.clear()
                    nbytes = self._model_bytes[key] = 4.0 * g.params
        return LOAD_PRIOR_S + nbytes / LOAD_PRIOR_BPS

    def load_estimates(
        self,
        tasks: Sequence[TaskSpec],
        keys: Sequence[str],
        nbytes: Sequence[float | None] | None = None,
    ) -> F64:
        """Seconds a cold start of each task costs on each device (`keys`), as a (task,
        device) matrix: the load reported there (`load_estimate`), else `load_prior` (with
        `nbytes[i]`, the model's size where known); 0 for tasks that load no model. Charged
        by placement where the device's agent holds no session of the model."""
        prior = [
            self.load_prior(t, nbytes[i] if nbytes is not None else None)
            for i, t in enumerate(tasks)
        ]
        out = np.empty((len(tasks), len(keys)))
        out[:] = np.asarray(prior)[:, None]
        if not len(self.corrections):
            return out
        col: dict[str, int] | None = None
        for i, t in enumerate(tasks):
            if not isinstance(t.run, OnnxRun):
                continue
            tracks = self.corrections.for_signature(task_signature(t))
            if tracks:
                if col is None:
                    col = {k: j for j, k in enumerate(keys)}
                for k, tr in tracks.items():
                    j = col.get(k)
                    if j is not None and tr.cold_n:
                        out[i, j] = tr.load_s
        return out

    def _set_id(self, dev_key: tuple[Any, ...], devices: Sequence[DeviceSpec]) -> int:
        got = self._set_ids.get(dev_key)
        if got is None:
            if len(self._set_ids) >= MAX_DEVICE_TABLES:  # start over: every int is stale
                self._set_ids.clear()
                self._set_devices.clear()
                self._tables.clear()
                self._cache.clear()
                self._cache_bytes = 0
            got = self._set_ids[dev_key] = len(self._set_ids)
            self._set_devices[got] = devices
        return got

    def _devices(
        self, set_id: int, devices: Sequence[DeviceSpec], tiers: Sequence[str] | None
    ) -> _DeviceTable:
        hit = self._tables.get(set_id)
        if hit is not None:
            return hit
        facts = [device_facts(d, tiers[j] if tiers else "") for j, d in enumerate(devices)]
        m = self.model
        ok = np.array([m is not None and m.applies(d) for d in facts], dtype=bool)
        if m is not None:
            a = np.where(ok, m.band_prior["q05"] - m.prior_log_scale, UNSEEN_BAND[0])
            b = np.where(ok, m.band_prior["q95"] - m.prior_log_scale, UNSEEN_BAND[1])
        else:
            a, b = np.full(len(facts), UNSEEN_BAND[0]), np.full(len(facts), UNSEEN_BAND[1])
        vectors = np.asarray([device_vector(d) for d in facts], dtype=np.float32).reshape(
            len(facts), -1
        )
        cols = np.flatnonzero(ok)
        clipped = vectors[cols]
        if m is not None:
            nt = len(m.lo) - vectors.shape[1]  # the task half comes first
            clipped = np.clip(clipped, m.lo[nt:], m.hi[nt:])
        table = _DeviceTable(
            gflops=np.array([d.gflops for d in facts]),
            mem_gbps=np.array([d.mem_gbps for d in facts]),
            overhead=np.array([d.call_overhead_s for d in facts]),
            vectors=vectors,
            ok=ok,
            band_lo=np.exp(a),
            band_hi=np.exp(b),
            cols=cols,
            clipped=np.ascontiguousarray(clipped, dtype=np.float32),
            every=len(cols) == len(facts),
        )
        self._tables[set_id] = table
        return table

    def _score(
        self, tasks: Sequence[TaskSpec], dt: _DeviceTable, out: F64, rows: Sequence[int]
    ) -> None:
        """Fill rows of `out` (base, lo, hi, source): priors first, then one ORT call that
        overwrites the pairs the model applies to."""
        m = self.model
        scale = math.exp(m.prior_log_scale) if m is not None else 1.0
        tvs: list[list[float]] = []
        roofs: list[F64] = []
        where: list[tuple[int, float]] = []  # (row, iterations) per block of ok devices
        cols = dt.cols
        nc = len(cols)
        graphs = [self.graph_of(t) for t in tasks]
        # tasks no model knows the graph of: the analytical prior, all in one go
        plain = [k for k, g in enumerate(graphs) if g is None]
        if plain:
            at = [rows[k] for k in plain]
            base, declared = estimate_matrix([tasks[k] for k in plain], dt.gflops)
            exact = declared[:, None]  # a declared time has no band
            out[0, at] = base
            out[1, at] = np.where(exact, base, base * dt.band_lo)
            out[2, at] = np.where(exact, base, base * dt.band_hi)
            out[3, at] = np.where(exact, DECLARED, PRIOR)
        for t, i, g in zip(tasks, rows, graphs, strict=True):
            run = t.run
            if g is None:
                continue
            iters = float(run.iterations) if isinstance(run, OnnxRun) else 1.0
            roof = g.flops / (dt.gflops * 1e9) + g.mem_bytes / (dt.mem_gbps * 1e9) + dt.overhead
            if not (dt.every and m is not None):  # the model overwrites every device's
                out[0, i] = iters * roof * scale
                out[1, i] = out[0, i] * dt.band_lo
                out[2, i] = out[0, i] * dt.band_hi
                out[3, i] = PRIOR
            if nc and m is not None:
                tvs.append(task_vector(g))
                roofs.append(np.log(roof if dt.every else roof[cols]))
                where.append((i, iters))
        if tvs and m is not None:
            self.ort_calls += 1
            # rows: each task's (clipped) half beside every applicable device's clipped half;
            # clipping is per feature, so this is the whole row clipped
            nt = len(m.lo) - dt.clipped.shape[1]
            tv = np.clip(np.asarray(tvs, dtype=np.float32), m.lo[:nt], m.hi[:nt])
            x = np.empty((len(tvs), nc, len(m.lo)), dtype=np.float32)
            x[:, :, :nt] = tv[:, None, :]
            x[:, :, nt:] = dt.clipped[None, :, :]
            log_roof = np.concatenate(roofs).astype(np.float32)
            secs = m.run(x.reshape(len(tvs) * nc, -1), log_roof, clipped=True)
            lo, hi = math.exp(m.band_model["q05"]), math.exp(m.band_model["q95"])
            dst: slice | NDArray[np.intp] = slice(None) if dt.every else cols
            for k, (i, iters) in enumerate(where):
                s = iters * secs[k * nc : (k + 1) * nc]
                out[0, i, dst] = s
                out[1, i, dst] = s * lo
                out[2, i, dst] = s * hi
                out[3, i, dst] = MODEL

    # -- learning ---------------------------------------------------------------------------
    def observe(
        self,
        task: TaskSpec,
        key: str,
        device: DeviceSpec,
        actual_s: float,
        now: float,
        base_s: float | None = None,
        *,
        cold: bool | None = None,
        load_s: float | None = None,
        shared: int | None = None,
    ) -> tuple[str, str] | None:
        """A reported duration; returns the (signature, device key) whose track changed.
        `base_s`: the uncorrected estimate the plan used, when the caller kept it (saves an
        inference per finished task); otherwise it is estimated again. `cold`: the run's
        session was made for it (kept apart from warm runs), `load_s`: what that took;
        `shared`: the most other jobs its agent ran at the same time (> 0: kept apart from
        the uncontended runs, in `contention`; None: not said, taken as 0)."""
        if base_s is None:
            base_s = float(self.estimate([task], [device], [key]).base[0, 0])
        sig = task_signature(task)
        if self.corrections.observe(
            sig, key, base_s, actual_s, now, cold=cold, load_s=load_s, shared=shared
        ):
            return sig, key
        track = self.corrections.get(sig, key)
        return (sig, key) if track is not None else None


@dataclass
class ErrorStats:
    """Predicted vs actual over every finished task this orchestrator saw."""

    n: int = 0
    within_10: int = 0
    abs_pct_sum: float = 0.0

    def add(self, predicted: float, actual: float) -> None:
        if predicted <= 0 or actual <= 0:
            return
        self.n += 1
        err = abs(predicted - actual) / actual
        self.abs_pct_sum += 100.0 * err
        self.within_10 += err <= 0.10

    def summary(self) -> str:
        if not self.n:
            return "no finished tasks yet"
        return (
            f"{self.n} tasks: MAPE {self.abs_pct_sum / self.n:.1f}%, "
            f"{100.0 * self.within_10 / self.n:.0f}% within ±10%"
        )
