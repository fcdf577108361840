"""The predictor's feature vector, defined once: what a task and a device look like to the model.

Graph features of an ONNX model come from its ModelProto (op counts by class, FLOPs of conv /
matmul / gemm from the inferred shapes, memory traffic), parsed with the `onnx` package: the
features of built-in models ship in `data/model_features.json` (linear in the batch size:
`base + per_batch * batch`, exact for the ops we count), and those of a model put as an artifact
are read by `mars artifact put` and kept in its object's meta; the orchestrator, which never
holds model files, adds the latter to its book at submission (`placement.store_reads`). Tasks
whose model has no known features are scored by the prior from their declared Profile.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from schemas.agent import DeviceSpec

DATA_DIR = Path(__file__).resolve().parent / "data"
FEATURES_FILE = DATA_DIR / "model_features.json"
FLOAT_BYTES = 4

#: Operator classes; every ONNX op type maps to exactly one.
# fmt: off
OP_CLASSES: dict[str, tuple[str, ...]] = {
    "conv": ("Conv", "ConvTranspose"),
    "matmul": ("MatMul", "Gemm", "MatMulInteger"),
    "elementwise": (
        "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt",
        "Pow", "Clip", "LeakyRelu", "HardSigmoid", "Neg", "Abs", "Max", "Min", "Gelu",
    ),
    "norm": (
        "Softmax", "LayerNormalization", "BatchNormalization", "ReduceMean", "ReduceSum",
        "ReduceMax", "InstanceNormalization",
    ),
    "pool": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"),
}
# fmt: on
_CLASS_OF = {op: cls for cls, ops in OP_CLASSES.items() for op in ops}
#: FLOPs per output element of the non-GEMM classes (rough but fixed, so the model can learn).
_PER_ELEMENT = {"Softmax": 5.0, "LayerNormalization": 8.0, "BatchNormalization": 2.0}


@dataclass(frozen=True, slots=True)
class GraphFeatures:
    """Per-call features of one ONNX model at one batch size (FLOPs count a multiply-add as 2)."""

    flops: float = 0.0
    conv_flops: float = 0.0
    matmul_flops: float = 0.0
    other_flops: float = 0.0
    #: Bytes read and written by all nodes (inputs + outputs, weights included), float32.
    mem_bytes: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    params: float = 0.0
    batch: float = 1.0
    nodes: float = 0.0
    n_conv: float = 0.0
    n_matmul: float = 0.0
    n_elementwise: float = 0.0
    n_norm: float = 0.0
    n_pool: float = 0.0
    n_other: float = 0.0

    def at_batch(self, per_batch: GraphFeatures, batch: int) -> GraphFeatures:
        """Features at `batch` when self holds the batch-independent part."""
        vals = {n: getattr(self, n) + getattr(per_batch, n) * batch for n in _NAMES}
        vals["batch"] = float(batch)
        return GraphFeatures(**vals)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def of(cls, values: Mapping[str, float]) -> GraphFeatures:
        """From `as_dict`'s form; names it does not know (a later release's) are left out."""
        return cls(**{f.name: float(values[f.name]) for f in fields(cls) if f.name in values})


#: GraphFeatures' field names, once (`dataclasses.fields` per call cost ~5 us of a scoring).
_NAMES: tuple[str, ...] = tuple(f.name for f in fields(GraphFeatures))

#: The model's input, in order. Task part first, then device part. Counts and sizes are
#: log10(1 + x); `threads` and `load` are plain numbers.
TASK_FEATURES: tuple[str, ...] = (
    "log_flops", "log_conv_flops", "log_matmul_flops", "log_other_flops", "log_mem_bytes",
    "log_bytes_in", "log_bytes_out", "log_params", "log_batch", "log_nodes", "log_n_conv",
    "log_n_matmul", "log_n_elementwise", "log_n_norm", "log_n_pool", "log_n_other",
    "intensity",
)  # fmt: skip
DEVICE_FEATURES: tuple[str, ...] = ("log_gflops", "log_mem_gbps", "threads", "load")
FEATURE_NAMES: tuple[str, ...] = TASK_FEATURES + DEVICE_FEATURES


def _l(x: float) -> float:
    return math.log10(1.0 + max(0.0, x))


def task_vector(g: GraphFeatures) -> list[float]:
    """The task half of the feature vector (see TASK_FEATURES)."""
    return [
        _l(g.flops), _l(g.conv_flops), _l(g.matmul_flops), _l(g.other_flops), _l(g.mem_bytes),
        _l(g.bytes_in), _l(g.bytes_out), _l(g.params), _l(g.batch), _l(g.nodes), _l(g.n_conv),
        _l(g.n_matmul), _l(g.n_elementwise), _l(g.n_norm), _l(g.n_pool), _l(g.n_other),
        # arithmetic intensity, FLOPs per byte moved: where the roofline bends
        _l(g.flops / max(g.mem_bytes, 1.0)),
    ]  # fmt: skip


# -- device side ----------------------------------------------------------------------------------
DEFAULT_MEM_GBPS = {"cpu": 10.0, "gpu": 300.0, "npu": 30.0}
DEFAULT_CALL_OVERHEAD_S = {"cpu": 5e-5, "gpu": 2e-4, "npu": 5e-4}


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    """What the predictor needs of a device; fields another component may not advertise yet
    (bandwidth, per-call overhead, threads) get per-kind defaults."""

    kind: str
    provider: str
    gflops: float
    mem_gbps: float
    call_overhead_s: float
    threads: int
    load: float
    emulated: bool
    tier: str = ""


def device_facts(d: DeviceSpec, tier: str = "", load: float = 0.0) -> DeviceFacts:
    bw = getattr(d, "mem_bandwidth_gbps", None)
    ovh_ms = getattr(d, "call_overhead_ms", None)
    threads = d.labels.get("threads") if d.labels else None
    return DeviceFacts(
        kind=d.kind,
        provider=d.provider,
        gflops=float(d.gflops),
        mem_gbps=float(bw) if bw else DEFAULT_MEM_GBPS.get(d.kind, 10.0),
        call_overhead_s=float(ovh_ms) / 1e3
        if ovh_ms
        else DEFAULT_CALL_OVERHEAD_S.get(d.kind, 1e-4),
        threads=int(threads) if threads and str(threads).isdigit() else 1,
        load=float(load),
        emulated=bool(d.emulated),
        tier=tier,
    )


def device_vector(d: DeviceFacts) -> list[float]:
    """The device half of the feature vector (see DEVICE_FEATURES)."""
    return [math.log10(d.gflops), math.log10(d.mem_gbps), float(d.threads), d.load]


def roofline_seconds(g: GraphFeatures, d: DeviceFacts) -> float:
    """Per-call time if compute and memory traffic did not overlap at all, plus the call."""
    return g.flops / (d.gflops * 1e9) + g.mem_bytes / (d.mem_gbps * 1e9) + d.call_overhead_s


def matrix(pairs: Iterable[tuple[GraphFeatures, DeviceFacts]]) -> NDArray[np.float32]:
    rows = [task_vector(g) + device_vector(d) for g, d in pairs]
    return np.asarray(rows, dtype=np.float32).reshape(len(rows), len(FEATURE_NAMES))


# -- graph parsing (needs `onnx`) -----------------------------------------------------------------
def _prod(xs: Iterable[int]) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def graph_features(model: Any, batch: int = 1) -> GraphFeatures:
    """Features of an onnx.ModelProto at a concrete batch (the first input dim of every graph
    input is bound to `batch`). Needs the `onnx` package."""
    import onnx
    from onnx import shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        dims = vi.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = batch
    m = shape_inference.infer_shapes(m, strict_mode=True)
    g = m.graph
    shapes: dict[str, list[int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        dims = vi.type.tensor_type.shape.dim
        shapes[vi.name] = [d.dim_value for d in dims]
    for init in g.initializer:
        shapes[init.name] = list(init.dims)
    inits = {i.name for i in g.initializer}

    counts = dict.fromkeys((*OP_CLASSES, "other"), 0)
    conv = mm = other = mem = 0.0
    for node in g.node:
        cls = _CLASS_OF.get(node.op_type, "other")
        counts[cls] += 1
        ins = [shapes.get(x, []) for x in node.input if x]
        outs = [shapes.get(x, []) for x in node.output if x]
        n_out = _prod(outs[0]) if outs else 0
        mem += FLOAT_BYTES * (sum(_prod(s) for s in ins) + sum(_prod(s) for s in outs))
        if node.op_type == "Conv":
            w = ins[1]  # (Cout, Cin/group, kh, kw)
            conv += 2.0 * n_out * _prod(w[1:])
        elif node.op_type == "MatMul":
            mm += 2.0 * n_out * ins[0][-1]
        elif node.op_type == "Gemm":
            trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
            k = ins[0][0] if trans_a else ins[0][-1]
            mm += 2.0 * n_out * k
        elif node.op_type in ("MaxPool", "AveragePool"):
            ks = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), [1])
            other += float(n_out * _prod(ks))
        elif node.op_type in ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceSum"):
            other += float(_prod(ins[0]))
        elif cls in ("elementwise", "norm"):
            other += _PER_ELEMENT.get(node.op_type, 1.0) * n_out
    b_in = sum(FLOAT_BYTES * _prod(shapes[v.name]) for v in g.input if v.name not in inits)
    b_out = sum(FLOAT_BYTES * _prod(shapes[v.name]) for v in g.output)
    params = sum(_prod(i.dims) for i in g.initializer)
    return GraphFeatures(
        flops=conv + mm + other,
        conv_flops=conv,
        matmul_flops=mm,
        other_flops=other,
        mem_bytes=mem,
        bytes_in=float(b_in),
        bytes_out=float(b_out),
        params=float(params),
        batch=float(batch),
        nodes=float(len(g.node)),
        n_conv=float(counts["conv"]),
        n_matmul=float(counts["matmul"]),
        n_elementwise=float(counts["elementwise"]),
        n_norm=float(counts["norm"]),
        n_pool=float(counts["pool"]),
        n_other=float(counts["other"]),
    )


def linear_in_batch(model: Any) -> tuple[GraphFeatures, GraphFeatures]:
    """(base, per_batch) such that features(b) = base + per_batch * b (from b = 1 and 2)."""
    f1, f2 = graph_features(model, 1), graph_features(model, 2)
    per = {f.name: getattr(f2, f.name) - getattr(f1, f.name) for f in fields(f1)}
    base = {f.name: getattr(f1, f.name) - per[f.name] for f in fields(f1)}
    return GraphFeatures(**base), GraphFeatures(**per)


# -- the shipped features file --------------------------------------------------------------------
class FeatureBook:
    """Graph features by model name (and sha256), loaded from JSON written at build time."""

    def __init__(self, entries: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._by_name: dict[str, tuple[GraphFeatures, GraphFeatures]] = {}
        self._sha: dict[str, str] = {}
        for name, e in (entries or {}).items():
            self.add(name, GraphFeatures(**e["base"]), GraphFeatures(**e["per_batch"]), e["sha256"])

    @classmethod
    def load(cls, path: Path = FEATURES_FILE) -> FeatureBook:
        if not path.exists():
            return cls()
        return cls(json.loads(path.read_text(encoding="utf-8")))

    def add(self, name: str, base: GraphFeatures, per: GraphFeatures, sha256: str = "") -> None:
        self._by_name[name] = (base, per)
        self._sha[name] = sha256

    def get(self, name: str, batch: int, sha256: str | None = None) -> GraphFeatures | None:
        """None when unknown, or when a pinned sha256 is not the one the features describe."""
        hit = self._by_name.get(name)
        if hit is None or (sha256 is not None and self._sha.get(name) not in ("", sha256)):
            return None
        return hit[0].at_batch(hit[1], batch)

    def dump(self) -> dict[str, dict[str, Any]]:
        return {
            n: {"sha256": self._sha[n], "base": b.as_dict(), "per_batch": p.as_dict()}
            for n, (b, p) in sorted(self._by_name.items())
        }


@cache
def shipped_book() -> FeatureBook:
    return FeatureBook.load()


def write_book(models: Sequence[tuple[str, Path]], out: Path = FEATURES_FILE) -> None:
    """Build the features file for these (name, .onnx path) pairs (needs `onnx`)."""
    import hashlib

    import onnx

    book = FeatureBook()
    for name, path in models:
        base, per = linear_in_batch(onnx.load(str(path)))
        book.add(name, base, per, hashlib.sha256(path.read_bytes()).hexdigest())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(book.dump(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
