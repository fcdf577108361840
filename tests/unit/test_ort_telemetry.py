"""ONNX Runtime's own telemetry (an upload to its vendor, a device id and an event cache under
~/.cache, from 1.29 on Linux) stays off in MARS processes: the orchestrator's predictor and an
agent's ONNX probe each run a real session in a fresh process with a home of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "orchestrator" / "predictor" / "predictor.onnx"
#: Variables ONNX Runtime reads as "running in CI" (it then keeps quiet whatever we do).
CI_VARS = (
    "CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
    "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR", "BITBUCKET_BUILD_NUMBER",
)  # fmt: skip


def telemetry_files(code: str, home: Path) -> list[Path]:
    """What a Python process running `code` left of ONNX Runtime's telemetry under `home`."""
    env = {k: v for k, v in os.environ.items() if k not in CI_VARS}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    env["HOME"] = str(home)
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True, timeout=120)
    return [p for p in home.rglob("*") if ".onnxruntime" in p.parts]


@pytest.fixture
def ort_telemetry_on(tmp_path: Path) -> None:
    """Skips unless this onnxruntime, left alone, leaves telemetry behind: else nothing
    below could tell whether it was turned off."""
    plain = f"import onnxruntime as ort; ort.InferenceSession({str(MODEL)!r})"
    if not telemetry_files(plain, tmp_path / "plain"):
        pytest.skip("this onnxruntime build keeps no telemetry: nothing to turn off")


@pytest.mark.usefixtures("ort_telemetry_on")
def test_the_orchestrator_s_predictor_leaves_no_onnx_runtime_telemetry(tmp_path: Path) -> None:
    code = "from orchestrator.predictor.model import LearnedModel; LearnedModel()"
    assert telemetry_files(code, tmp_path / "orch") == []


@pytest.mark.usefixtures("ort_telemetry_on")
def test_an_agent_s_onnx_probe_leaves_no_onnx_runtime_telemetry(tmp_path: Path) -> None:
    code = (
        "from edge_agent.ortprobe import onnx_call_overhead_ms; assert onnx_call_overhead_ms() > 0"
    )
    assert telemetry_files(code, tmp_path / "agent") == []
