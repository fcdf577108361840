"""The CLI against a real cluster: submit --wait's exit code, list, bad files, schema output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster

pytestmark = pytest.mark.e2e


async def test_submit_wait_exit_codes(nats_url: str, tmp_path: Path) -> None:
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=2)})
    try:
        ok = tmp_path / "ok.json"
        ok.write_text(
            json.dumps(
                {
                    "name": "ok",
                    "tasks": [
                        {"id": "x", "run": {"kind": "synthetic", "seconds": 0.01}},
                        {"id": "y", "run": {"kind": "synthetic", "seconds": 0.01}, "deps": ["x"]},
                    ],
                }
            )
        )
        rc, out, err = await mars_cli("submit", str(ok), "--wait", "--nats", nats_url)
        assert rc == 0, out + err
        assert "succeeded" in out
        rc, out, err = await mars_cli("list", "--nats", nats_url)  # which replica holds it, too
        assert rc == 0, out + err
        line = next(x for x in out.splitlines() if " ok " in x)
        assert line.split()[1:] == ["ok", "succeeded", "2", "tasks", orch.owner], line
        failing = tmp_path / "fails.yaml"
        failing.write_text("name: bad\ntasks:\n  - id: m\n    run: {kind: onnx, model: nope}\n")
        rc, out, err = await mars_cli("submit", str(failing), "--wait", "--nats", nats_url)
        assert rc == 2 and "error unschedulable" in err and "m@a:cpu0: missing_model" in err
        broken = tmp_path / "broken.yaml"
        broken.write_text("name: bad\ntasks:\n  - id: a\n    deps: [zz]\n")
        rc, out, err = await mars_cli("submit", str(broken), "--nats", nats_url)
        assert rc == 2 and "error invalid" in err and "run" in err
    finally:
        await stop_cluster(orch, agents)


def test_schema_writes_every_public_model(tmp_path: Path) -> None:
    from schemas import PUBLIC_MODELS

    proc = subprocess.run(
        [sys.executable, "-m", "console.cli", "schema", "--out", str(tmp_path)],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0
    files = sorted(p.name for p in tmp_path.glob("*.schema.json"))
    assert files == sorted(f"{m.__name__}.schema.json" for m in PUBLIC_MODELS)
    sub = json.loads((tmp_path / "PipelineSpec.schema.json").read_text())
    assert sub["additionalProperties"] is False and "tasks" in sub["required"]
