"""Graph features of any ONNX model put as an artifact: read at put, kept in its object's
meta (never on its entry, which agents and CLIs of every release since level 4 read), and
given to the predictor's book under the name tasks use, so its tasks get the learned model."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import msgpack
import numpy as np
import onnx
import pytest
from nats.js.errors import ObjectNotFoundError
from onnx import TensorProto, helper, numpy_helper
from pydantic import Field, StringConstraints

from console.artifacts import _features_or_none, model_features
from orchestrator.placement import store_reads
from orchestrator.placement.store_reads import StoreLookup
from orchestrator.predictor.features import FeatureBook, GraphFeatures, linear_in_batch
from orchestrator.predictor.model import Predictor, shipped_model
from schemas import DeviceSpec, TaskSpec
from schemas.artifacts import (
    FEATURES_HEADER,
    ArtifactInfo,
    ModelFeatures,
    features_headers,
    features_of_headers,
)
from schemas.base import WireModel
from schemas.codec import decode, encode
from schemas.wire import ADDED

SHA = "cd" * 32


class Level6ArtifactInfo(WireModel):
    """`ArtifactInfo` as agents and CLIs of levels 4 to 6 read it (closed: an extra field is
    refused, as they refuse it)."""

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: Annotated[int, Field(ge=0, le=4 << 30)]
    kind: str
    created: Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)]


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


def test_an_entry_is_what_releases_since_level_4_read_and_features_are_meta(
    tmp_path: Path,
) -> None:
    info = ArtifactInfo(name="m", sha256=SHA, size=3, kind="onnx", created=1.7e9)
    assert ArtifactInfo not in ADDED  # no field an older reader would refuse
    assert set(msgpack.unpackb(encode(info))) == {"name", "sha256", "size", "kind", "created"}
    assert decode(encode(info), Level6ArtifactInfo).model_dump() == info.model_dump()
    # the features go in the object's meta, as compact JSON, and read back
    feats = model_features(matmul_chain(tmp_path / "chain.onnx"))
    headers = features_headers(feats)
    (text,) = headers[FEATURES_HEADER]
    assert " " not in text and features_of_headers(headers) == feats
    assert features_of_headers(None) is None and features_of_headers({"Other": ["x"]}) is None
    assert features_of_headers({FEATURES_HEADER: text}) == feats  # (a bare string too)


@pytest.mark.parametrize(
    "headers",
    [
        ["not", "a", "map"],
        {FEATURES_HEADER: ["{}"]},
        {FEATURES_HEADER: ["not json"]},
        {FEATURES_HEADER: ["{}", "{}"]},
        {FEATURES_HEADER: 7},
        {FEATURES_HEADER: ['{"base":{"flops":1e999},"per_batch":{}}']},
        {FEATURES_HEADER: ['{"base":{"Flops!":1},"per_batch":{}}']},
        {FEATURES_HEADER: ['{"base":{},"per_batch":{},"more":1}']},
        {FEATURES_HEADER: ['{"base":{"flops":1},"per_batch":{}}' + " " * 20_000]},
    ],
)
def test_meta_that_is_not_features_is_refused_saying_so(headers: Any) -> None:
    with pytest.raises(ValueError):
        features_of_headers(headers)


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


class _Meta:
    def __init__(self, headers: Any) -> None:
        self.headers = headers


class _Objects:
    """The artifacts object store's `get_info`, counting the asks."""

    def __init__(self, headers: dict[str, Any]) -> None:
        self.headers, self.asked = headers, 0

    async def get_info(self, sha: str) -> _Meta:
        self.asked += 1
        if sha not in self.headers:
            raise ObjectNotFoundError
        return _Meta(self.headers[sha])


class _Js:
    def __init__(self, objects: _Objects) -> None:
        self.objects = objects

    async def object_store(self, bucket: str) -> _Objects:
        return self.objects


async def test_an_object_s_features_reach_the_predictor_so_the_model_scores_it(
    tmp_path: Path,
) -> None:
    model = shipped_model()
    assert model is not None
    feats = model_features(matmul_chain(tmp_path / "chain.onnx"))
    info = ArtifactInfo(name="m", sha256=SHA, size=3, kind="onnx", created=1.7e9)
    ref, cpu = info.ref, DeviceSpec(device_id="cpu0", kind="cpu", gflops=50.0)
    book = FeatureBook()
    p = Predictor(model=model, book=book)
    assert p.estimate([_task(ref)], [cpu]).source_name(0, 0) == "prior"  # unknown: the prior
    objects = _Objects({SHA: features_headers(feats)})
    lookup = StoreLookup(js=_Js(objects), book=book)
    await lookup._learn(ref, info)
    want = GraphFeatures.of(feats.base).at_batch(GraphFeatures.of(feats.per_batch), 4)
    p = Predictor(model=model, book=book)
    assert p.graph_of(_task(ref)) == want
    assert p.estimate([_task(ref)], [cpu]).source_name(0, 0) == "model"
    # another name for the same bytes: read from the cache by digest, not asked again
    await lookup._learn(f"n@{SHA}", info.model_copy(update={"name": "n"}))
    assert p.graph_of(_task(f"n@{SHA}")) == want and objects.asked == 1


async def test_an_object_without_features_or_with_bad_ones_adds_nothing_and_is_not_asked_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    hostile, plain, gone = "ab" * 32, "ef" * 32, "12" * 32
    objects = _Objects({hostile: {FEATURES_HEADER: ['{"base": 1']}, plain: None})
    book = FeatureBook()
    lookup = StoreLookup(js=_Js(objects), book=book)
    caplog.set_level(logging.WARNING, "mars.orchestrator.store")
    for sha in (hostile, plain, gone):
        info = ArtifactInfo(name="m", sha256=sha, size=3, kind="onnx", created=1.7e9)
        for _ in range(2):  # the second time from the cache: not asked again
            await lookup._learn(info.ref, info)
        assert Predictor(book=book).graph_of(_task(info.ref)) is None
    assert objects.asked == 3
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"artifact {hostile}: its object's meta holds no graph features")
    # asked again once NO_FEATURES_S passed (a later put may have added them)
    monkeypatch.setattr(store_reads, "NO_FEATURES_S", -1.0)
    lookup = StoreLookup(js=_Js(objects), book=book)
    info = ArtifactInfo(name="m", sha256=plain, size=3, kind="onnx", created=1.7e9)
    await lookup._learn(info.ref, info)
    await lookup._learn(info.ref, info)
    assert objects.asked == 5


def test_graph_features_of_a_mapping_keep_the_names_they_know() -> None:
    g = GraphFeatures(flops=3.0, nodes=2.0, batch=0.0)
    assert GraphFeatures.of({**g.as_dict(), "a_later_feature": 9.0}) == g
