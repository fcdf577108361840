"""Graph features of any ONNX model put as an artifact: read at put, kept on its entry, and
given to the predictor's book under the name tasks use, so its tasks get the learned model."""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from console.artifacts import _features_or_none, model_features
from orchestrator.placement.store_reads import StoreLookup
from orchestrator.predictor.features import FeatureBook, GraphFeatures, linear_in_batch
from orchestrator.predictor.model import Predictor, shipped_model
from schemas import DeviceSpec, TaskSpec
from schemas.artifacts import ArtifactInfo, ModelFeatures
from schemas.codec import decode, encode
from schemas.wire import ADDED, WIRE_LEVEL

SHA = "cd" * 32


def matmul_chain(path: Path, width: int = 48, layers: int = 3) -> Path:
    """x[N, width] through `layers` MatMul + Relu: a model no release ships."""
    nodes, inits, prev = [], [], "x"
    rng = np.random.default_rng(0)
    for i in range(layers):
        w = rng.standard_normal((width, width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        out = "y" if i == layers - 1 else f"r{i}"
        nodes.append(helper.make_node("Relu", [f"m{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_model_s_features_are_its_graph_s_at_batch_one_and_per_batch(tmp_path: Path) -> None:
    path = matmul_chain(tmp_path / "chain.onnx")
    base, per = linear_in_batch(onnx.load(str(path)))
    got = model_features(path)
    assert got == ModelFeatures(base=base.as_dict(), per_batch=per.as_dict())
    # 3 MatMuls of 48x48 per row: 2 * 48 * 48 * 3 FLOPs per batch item, none without one
    assert got.per_batch["matmul_flops"] == 2 * 48 * 48 * 3 and got.base["matmul_flops"] == 0
    assert got.base["params"] == 3 * 48 * 48 and got.base["n_matmul"] == 3


def test_an_entry_keeps_its_features_and_one_without_reads_in_older_releases(
    tmp_path: Path,
) -> None:
    feats = model_features(matmul_chain(tmp_path / "chain.onnx"))
    info = ArtifactInfo(name="m", sha256=SHA, size=3, kind="onnx", created=1.7e9, features=feats)
    assert decode(encode(info), ArtifactInfo) == info
    assert ADDED[ArtifactInfo] == {"features": 7} and WIRE_LEVEL == 7
    # written without features at level 6: the bytes an older release wrote, and reads
    plain = info.model_copy(update={"features": None})
    assert set(msgpack.unpackb(encode(plain, level=6))) == {
        "name", "sha256", "size", "kind", "created",
    }  # fmt: skip
    assert decode(encode(plain, level=6), ArtifactInfo) == plain


def test_a_file_that_is_no_onnx_graph_gets_no_features_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 these bytes are no ModelProto \xff\xff")
    assert _features_or_none(bad) is None
    err = capsys.readouterr().err
    assert err.startswith(f"mars artifact put: {bad}: its ONNX graph does not parse (")
    assert err.endswith("stored without graph features (the predictor scores its tasks by "
                        "their declared profile)\n")  # fmt: skip


def _task(ref: str, batch: int = 4) -> TaskSpec:
    return TaskSpec.model_validate(
        {"id": "t", "run": {"kind": "onnx", "model": ref, "batch": batch},
         "profile": {"flops": 1e6}}
    )  # fmt: skip


def test_features_added_to_the_book_are_what_graph_of_finds() -> None:
    book = FeatureBook()
    base = GraphFeatures(flops=10.0, matmul_flops=10.0, params=5.0, nodes=2.0, n_matmul=1.0)
    per = GraphFeatures(flops=100.0, matmul_flops=100.0, mem_bytes=400.0, bytes_in=40.0)
    ref = f"m@{SHA}"
    book.add(ref, base, per, SHA)
    p = Predictor(book=book)
    assert p.graph_of(_task(ref, 4)) == base.at_batch(per, 4)
    assert p.graph_of(_task(f"other@{SHA}")) is None


def test_an_entry_s_features_reach_the_predictor_so_the_model_scores_it(tmp_path: Path) -> None:
    model = shipped_model()
    assert model is not None
    feats = model_features(matmul_chain(tmp_path / "chain.onnx"))
    info = ArtifactInfo(name="m", sha256=SHA, size=3, kind="onnx", created=1.7e9, features=feats)
    ref, cpu = info.ref, DeviceSpec(device_id="cpu0", kind="cpu", gflops=50.0)
    book = FeatureBook()
    p = Predictor(model=model, book=book)
    assert p.estimate([_task(ref)], [cpu]).source_name(0, 0) == "prior"  # unknown: the prior
    lookup = StoreLookup(js=None, book=book)
    lookup._learn(ref, info)
    want = GraphFeatures.of(feats.base).at_batch(GraphFeatures.of(feats.per_batch), 4)
    p = Predictor(model=model, book=book)
    assert p.graph_of(_task(ref)) == want
    assert p.estimate([_task(ref)], [cpu]).source_name(0, 0) == "model"
    # an entry without features (a bundle, a model that did not parse) adds nothing
    lookup._learn(f"n@{SHA}", info.model_copy(update={"name": "n", "features": None}))
    assert p.graph_of(_task(f"n@{SHA}")) is None


def test_graph_features_of_a_mapping_keep_the_names_they_know() -> None:
    g = GraphFeatures(flops=3.0, nodes=2.0, batch=0.0)
    assert GraphFeatures.of({**g.as_dict(), "a_later_feature": 9.0}) == g
