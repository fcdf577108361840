"""Artifacts over a real nats-server: put by the CLI, fetched by agents on first use, verified,
reused, evicted; shipped Python code only where its agent's owner allows it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import sys
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest

from console import artifacts
from edge_agent.artifacts import ArtifactCache, ArtifactError
from edge_agent.core import Job
from edge_agent.executors import BUILTIN_MODELS, Output
from edge_agent.service import Agent
from orchestrator.service import Orchestrator
from schemas import PipelineSpec, TaskSpec, subjects
from schemas.agent import AgentAdvert
from schemas.artifacts import ArtifactRef
from schemas.codec import decode
from schemas.errors import ServiceError
from tests.harness import EMULATED_CPU, agent_config, mars_cli
from transport.rpc import settle

pytestmark = pytest.mark.integration

BUNDLE_MODULE = "mars_shipped_demo"


class KeepingAgent(Agent):
    """A real agent that keeps each task's output, by pipeline."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.kept: dict[str, bytes] = {}
        self.runs = 0

    async def _run(self, job: Job) -> Output:
        self.runs += 1
        out = await super()._run(job)
        self.kept[job.offer.pipeline_id] = out.data
        return out


@contextlib.asynccontextmanager
async def cluster(
    url: str, cache: Path, **config: Any
) -> AsyncIterator[tuple[Orchestrator, KeepingAgent]]:
    orch = Orchestrator(url)
    await orch.start()
    cfg = agent_config(
        "s1", "edge", probe_cpu=False, devices=[EMULATED_CPU],
        allowed_kinds=["synthetic", "onnx", "python"], artifact_cache_dir=str(cache), **config,
    )  # fmt: skip
    agent = KeepingAgent(url, cfg, agent_id="a1", calibrate=False)
    await agent.start()
    try:
        assert await orch.wait_for_agents(1, timeout=10.0) == 1
        yield orch, agent
    finally:
        await agent.stop()
        await orch.stop()


async def run_one(orch: Orchestrator, pid: str, run: dict[str, Any]) -> Any:
    spec = PipelineSpec(name=pid, tasks=[TaskSpec.model_validate({"id": "t", "run": run})])
    await orch.submit_spec(spec, pipeline_id=pid)
    return await orch.wait_terminal(pid, 30.0)


@contextlib.asynccontextmanager
async def jetstream(url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


def bundle(path: Path, source: str) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{BUNDLE_MODULE}/__init__.py", "")
        z.writestr(f"{BUNDLE_MODULE}/ops.py", source)
    return path


def blob(path: Path, size: int, fill: bytes) -> Path:
    path.write_bytes(fill * size)
    return path


async def test_a_model_put_by_the_cli_is_fetched_once_verified_and_reused(
    nats_url: str, tmp_path: Path
) -> None:
    model = tmp_path / "tiny.onnx"
    model.write_bytes((BUILTIN_MODELS / "tiny_cnn.onnx").read_bytes())
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    code, out, err = await mars_cli("artifact", "put", str(model), "--nats", nats_url)
    assert code == 0, err
    assert out.strip() == f"tiny@{sha}"
    cache = tmp_path / "cache"
    async with cluster(nats_url, cache) as (orch, agent):
        assert not list(cache.rglob("*.onnx")) and agent.artifacts.used == 0  # never had it
        assert orch.view.agents["a1"].advert.artifacts == []
        nc = await nats.connect(nats_url)
        told = asyncio.Event()

        async def on_advert(msg: Any) -> None:
            if sha in decode(msg.data, AgentAdvert).artifacts:
                told.set()

        await nc.subscribe(subjects.advert("a1"), cb=on_advert)
        await settle(nc)
        try:
            runs = [
                await run_one(orch, f"p{i}", {"kind": "onnx", "model": f"tiny@{sha}",
                                              "random_inputs": True})
                for i in range(2)
            ]  # fmt: skip
            assert [r.state for r in runs] == ["succeeded"] * 2, [r.reason for r in runs]
            assert agent.artifacts.stats["fetched"] == 1  # the second run took it from disk
            held = cache / "a1" / sha
            assert hashlib.sha256(held.read_bytes()).hexdigest() == sha
            assert agent.kept["p0"] == agent.kept["p1"]  # the same model, the same seed
            # and the agent says it holds it: placement charges the fetch to others only
            await asyncio.wait_for(told.wait(), 10.0)
            # the orchestrator reads it too (an agent's adverts at most every ADVERT_GAP_S)
            async with asyncio.timeout(10.0):
                while sha not in orch.view.agents["a1"].advert.artifacts:
                    orch.cluster_changed.clear()
                    await orch.cluster_changed.wait()
            assert orch.pipelines["p0"].artifact_sizes == {sha: model.stat().st_size}
        finally:
            await nc.close()


async def test_an_unknown_artifact_or_bytes_not_matching_their_digest_fail_the_task_clearly(
    nats_url: str, tmp_path: Path
) -> None:
    real = blob(tmp_path / "m.onnx", 4096, b"m")
    async with jetstream(nats_url) as js:
        info, _ = await artifacts.put(js, real)
        # the store's copy replaced by other bytes of the same size (tampered, or corrupt)
        store = await js.object_store(subjects.ARTIFACTS_BUCKET)
        await store.put(info.sha256, b"x" * 4096)
    cache = tmp_path / "cache"
    ghost = "ghost@" + "0" * 64
    async with cluster(nats_url, cache) as (orch, agent):
        # named by a submission: refused then, nothing placed or booked
        with pytest.raises(ServiceError) as refused:
            await run_one(orch, "ghost", {"kind": "onnx", "model": ghost})
        assert refused.value.code == "not_found"
        assert f"artifact {ghost} not stored: `mars artifact put FILE` first" in str(
            refused.value.message
        )
        assert "ghost" not in orch.pipelines
        # gone from the store after the submission: the agent that fetches it says so
        with pytest.raises(ArtifactError, match=f"{ghost} is not in the artifact store"):
            await agent.artifacts.hold(ArtifactRef("ghost", "0" * 64), "onnx")
        # a bundle named where a model is wanted
        with pytest.raises(ServiceError) as wrong:
            await run_one(orch, "wrong", {"kind": "python", "entry": "m:f", "bundle": info.ref})
        assert wrong.value.code == "invalid"
        said = wrong.value.message
        assert f"artifact {info.ref} is of kind onnx, its task needs python-bundle" in said
        bad = await run_one(orch, "bad", {"kind": "onnx", "model": info.ref})
        assert bad.state == "failed"
        assert f"artifact {info.ref}: sha256 mismatch" in bad.reason, bad.reason
        assert "refused and deleted" in bad.reason
        assert agent.artifacts.stats["refused"] == 1 and agent.artifacts.stats["fetched"] == 0
        assert [p.name for p in (cache / "a1").iterdir()] == []  # nothing of it kept


DOUBLE = """
import os


def double(x):
    print("noise on stdout")  # never taken for the output
    return {"doubled": x * 2, "pid": os.getpid()}
"""


async def test_shipped_code_is_refused_unless_the_agents_owner_allows_it(
    nats_url: str, tmp_path: Path
) -> None:
    async with jetstream(nats_url) as js:
        info, _ = await artifacts.put(js, bundle(tmp_path / "demo.zip", DOUBLE))
    assert info.kind == "python-bundle"
    call = {"kind": "python", "entry": f"{BUNDLE_MODULE}.ops:double", "kwargs": {"x": 21},
            "bundle": info.ref}  # fmt: skip
    async with cluster(nats_url, tmp_path / "off") as (orch, agent):
        with pytest.raises(ServiceError) as refused:
            await run_one(orch, "off", call)
        assert refused.value.code == "unschedulable"
        assert any(
            "not_allowlisted" in v
            and "shipped code is not allowed by this agent's owner "
            "(allow_shipped_code is off in its config)"
            in v
            for v in refused.value.details.values()
        ), refused.value.details
        assert agent.artifacts.stats["fetched"] == 0 and agent.runs == 0  # not even fetched
    async with cluster(nats_url, tmp_path / "on", allow_shipped_code=True) as (orch, agent):
        run = await run_one(orch, "on", call)
        assert run.state == "succeeded", run.reason
        got = json.loads(agent.kept["on"])
        assert got["doubled"] == 42
        assert got["pid"] != os.getpid()  # in a process of its own
        assert BUNDLE_MODULE not in sys.modules  # nothing of it stayed in the agent
        assert agent.artifacts.stats["fetched"] == 1


async def test_put_ls_rm_keep_one_copy_per_content_and_leave_nothing_behind(
    nats_url: str, tmp_path: Path
) -> None:
    one = blob(tmp_path / "one.onnx", 1000, b"1")
    async with jetstream(nats_url) as js:
        first, sent = await artifacts.put(js, one)
        assert sent and first.ref == f"one@{hashlib.sha256(b'1' * 1000).hexdigest()}"
        again, sent = await artifacts.put(js, one)
        assert not sent and again == first  # idempotent: same key, same entry
        alias, sent = await artifacts.put(js, one, name="alias")
        assert not sent and alias.sha256 == first.sha256  # one copy of the bytes
    code, out, err = await mars_cli("artifact", "ls", "--json", "--nats", nats_url)
    assert code == 0, err
    assert {(r["name"], r["sha256"], r["stored"]) for r in json.loads(out)} == {
        ("alias", first.sha256, True), ("one", first.sha256, True)
    }  # fmt: skip
    code, out, err = await mars_cli("artifact", "rm", "one", "--nats", nats_url)
    assert code == 0 and out.strip() == f"removed {first.ref}", err
    async with jetstream(nats_url) as js:
        assert [x.stored for x in await artifacts.listing(js)] == [True]  # alias keeps it
    code, out, err = await mars_cli("artifact", "rm", alias.ref, "--nats", nats_url)
    assert code == 0, err
    code, _, err = await mars_cli("artifact", "rm", "one", "--nats", nats_url)
    assert code == 2 and "no artifact one" in err
    async with jetstream(nats_url) as js:
        assert await artifacts.listing(js) == []
        for stream in (f"KV_{subjects.ARTIFACT_NAMES_BUCKET}", f"OBJ_{subjects.ARTIFACTS_BUCKET}"):
            assert (await js.stream_info(stream)).state.messages == 0, stream


async def test_the_cache_keeps_to_its_bound_least_recently_used_first(
    nats_url: str, tmp_path: Path
) -> None:
    async with jetstream(nats_url) as js:
        a, b, c, big = [
            ArtifactRef(i.name, i.sha256)
            for i, _ in [
                await artifacts.put(js, blob(tmp_path / f"{n}.onnx", size, n.encode()))
                for n, size in (("a", 400), ("b", 400), ("c", 400), ("big", 1500))
            ]
        ]
        cache = ArtifactCache(tmp_path / "cache", 1000)
        cache.attach(js)

        async def use(ref: ArtifactRef) -> None:
            async with cache.holding(str(ref), "onnx") as path:
                assert path is not None and path.name == ref.sha256

        for ref in (a, b, a, c):  # a used again after b: b is the least recently used
            await use(ref)
        assert sorted(p.name for p in cache.dir.iterdir()) == sorted([a.sha256, c.sha256])
        assert cache.stats["fetched"] == 3 and cache.stats["evicted"] == 1
        async with cache.holding(str(c), "onnx"):  # held while b comes: a goes, not c
            await use(b)
            assert cache.cached(c.sha256) and not cache.cached(a.sha256)
        assert cache.used <= 1000
        with pytest.raises(ArtifactError, match="more than this agent's whole artifact cache"):
            await use(big)
        with pytest.raises(ArtifactError, match=r"is a onnx, not python-bundle"):
            await cache.hold(a, "python-bundle")


async def test_a_cached_file_that_changed_on_disk_is_fetched_again(
    nats_url: str, tmp_path: Path
) -> None:
    async with jetstream(nats_url) as js:
        info, _ = await artifacts.put(js, blob(tmp_path / "m.onnx", 300, b"m"))
        ref = ArtifactRef(info.name, info.sha256)
        first = ArtifactCache(tmp_path / "cache", 1 << 20)
        first.attach(js)
        await first.prefetch(str(ref), "onnx")
        path = first.dir / info.sha256
        path.chmod(0o644)
        path.write_bytes(b"M" * 300)  # changed while the agent was down
        later = ArtifactCache(tmp_path / "cache", 1 << 20)  # the agent's next run
        later.attach(js)
        async with later.holding(str(ref), "onnx") as held:
            assert held is not None and held.read_bytes() == b"m" * 300
        assert later.stats["refused"] == 1 and later.stats["fetched"] == 1
