"""A model no release ships, put with `mars artifact put` over a real nats-server: its
object's meta carries its graph features (its entry is the one older agents and CLIs read),
and the orchestrator scores its tasks with the learned model on them, not with the FLOPs
prior; a file that does not parse is stored all the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nats
import onnx
import pytest
from nats.js.api import ObjectMeta, ObjectMetaOptions
from nats.js.errors import NotFoundError

from console.artifacts import CHUNK_BYTES, _add_features, _delete_object, model_features
from orchestrator.predictor.features import GraphFeatures, linear_in_batch
from schemas import PipelineSpec, TaskSpec, subjects
from schemas.artifacts import ArtifactInfo, ModelFeatures, features_of_headers
from schemas.codec import decode
from schemas.digests import sha256_file
from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster
from tests.unit.test_artifact_features import Level6ArtifactInfo, matmul_chain

pytestmark = pytest.mark.integration

#: A real (not emulated) CPU: the learned model applies to the devices it was trained on.
CPU = {"device_id": "cpu0", "kind": "cpu", "gflops": 100.0}


async def _entry(url: str, name: str, sha: str) -> ArtifactInfo:
    """The entry, read as this release and as agents and CLIs of levels 4 to 6 read it."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(subjects.ARTIFACT_NAMES_BUCKET)
        value = (await kv.get(subjects.artifact_key(name, sha))).value or b""
        info = decode(value, ArtifactInfo)
        assert decode(value, Level6ArtifactInfo).model_dump() == info.model_dump()
        return info
    finally:
        await nc.close()


async def _features(url: str, sha: str) -> ModelFeatures | None:
    """The features in the meta of the object stored under `sha`."""
    nc = await nats.connect(url)
    try:
        objects = await nc.jetstream().object_store(subjects.ARTIFACTS_BUCKET)
        return features_of_headers((await objects.get_info(sha)).headers)
    finally:
        await nc.close()


async def test_a_put_model_s_tasks_are_scored_by_the_learned_model_on_its_features(
    nats_url: str, tmp_path: Path
) -> None:
    path = matmul_chain(tmp_path / "chain.onnx", width=64, layers=4)
    sha = sha256_file(path)
    code, out, err = await mars_cli("artifact", "put", str(path), "--nats", nats_url)
    assert (code, out, err) == (0, f"chain@{sha}\n", "")
    base, per = linear_in_batch(onnx.load(str(path)))
    assert (await _entry(nats_url, "chain", sha)).ref == f"chain@{sha}"
    feats = await _features(nats_url, sha)
    assert feats is not None
    assert (GraphFeatures.of(feats.base), GraphFeatures.of(feats.per_batch)) == (base, per)
    cfg = agent_config(
        "s1", "edge", probe_cpu=False, devices=[CPU], allowed_kinds=["onnx"],
        artifact_cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    orch, agents = await start_cluster(nats_url, {"a1": cfg})
    try:
        ref = f"chain@{sha}"
        task = TaskSpec.model_validate(
            {"id": "t", "run": {"kind": "onnx", "model": ref, "batch": 8, "random_inputs": True}}
        )
        assert orch.predictor.graph_of(task) is None  # nothing known of it before it is named
        await orch.submit_spec(PipelineSpec(name="p", tasks=[task]), pipeline_id="p")
        run = await orch.wait_terminal("p", 30.0)
        assert run.state == "succeeded", run.reason
        # the features its put read, at the task's batch, scored by the learned model
        assert orch.predictor.graph_of(task) == base.at_batch(per, 8)
        device = orch.view.agents["a1"].advert.devices[0]
        est = orch.predictor.estimate([task], [device], ["a1:cpu0"])
        assert est.source_name(0, 0) == "model"
    finally:
        await stop_cluster(orch, agents)


async def test_a_model_that_does_not_parse_is_stored_without_features(
    nats_url: str, tmp_path: Path
) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07 these bytes are no ModelProto \xff\xff")
    sha = sha256_file(bad)
    code, out, err = await mars_cli("artifact", "put", str(bad), "--nats", nats_url)
    assert (code, out) == (0, f"broken@{sha}\n")
    assert err.startswith(f"mars artifact put: {bad}: its ONNX graph does not parse (")
    assert err.endswith("stored without graph features (the predictor scores its tasks by "
                        "their declared profile)\n")  # fmt: skip
    assert (await _entry(nats_url, "broken", sha)).ref == f"broken@{sha}"
    assert await _features(nats_url, sha) is None
    code, out, err = await mars_cli("artifact", "ls", "--json", "--nats", nats_url)
    assert code == 0, err
    (row,) = json.loads(out)
    assert row == {
        "name": "broken", "sha256": sha, "size": bad.stat().st_size, "kind": "onnx",
        "created": row["created"], "stored": True,
    }  # fmt: skip


async def test_a_model_stored_without_features_gets_them_from_the_next_put(
    nats_url: str, tmp_path: Path
) -> None:
    """Bytes an older CLI put (no features in their meta): a put of the same file adds them
    to the meta, bytes untouched; and never to an object removed meanwhile."""
    path = matmul_chain(tmp_path / "chain.onnx")
    sha = sha256_file(path)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        objects: Any = await js.create_object_store(subjects.ARTIFACTS_BUCKET)
        meta = ObjectMeta(
            name=sha, description="onnx old",
            options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
        )  # fmt: skip
        stored = await objects.put(sha, path.read_bytes(), meta=meta)
        assert await _features(nats_url, sha) is None
        code, out, err = await mars_cli("artifact", "put", str(path), "--nats", nats_url)
        assert (code, out, err) == (
            0, f"chain@{sha}\n", "(the store held these bytes already)\n",
        )  # fmt: skip
        assert await _features(nats_url, sha) == model_features(path)
        info = await objects.get_info(sha)
        assert (info.nuid, info.digest, info.size, info.description) == (
            stored.nuid, stored.digest, stored.size, "onnx old",
        )  # fmt: skip
        assert (await objects.get(sha)).data == path.read_bytes()
        # removed before the features are added: nothing is written back
        await _delete_object(js, objects, sha)
        assert not await _add_features(js, sha, model_features(path))
        with pytest.raises(NotFoundError):
            await objects.get_info(sha, show_deleted=True)
    finally:
        await nc.close()
