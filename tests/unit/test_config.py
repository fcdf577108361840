"""Shipped config and pipeline files stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.config import load_config
from orchestrator.pipeline_files import load_pipeline
from schemas.codec import DecodeError

REPO = Path(__file__).resolve().parents[2]


def test_example_agent_config_loads_and_marks_emulated_devices() -> None:
    cfg = load_config(REPO / "deploy" / "agent.example.yaml")
    assert cfg.site == "plant-a" and cfg.devices[0].emulated is True


def test_example_pipeline_loads() -> None:
    spec = load_pipeline(REPO / "orchestrator" / "examples" / "video-analytics.yaml")
    assert spec.tasks[0].id == "decode"
    assert any(t.run.kind == "onnx" for t in spec.tasks)


def test_bad_yaml_is_a_coded_error(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(DecodeError) as err:
        load_pipeline(p)
    assert err.value.code == "bad_request"
