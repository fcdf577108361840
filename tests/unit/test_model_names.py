"""A task names a model; it can never name a file elsewhere on the agent (an absolute path or
`..`), neither past the schema nor past the agent's own lookup."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_agent.executors import resolve_model
from schemas.pipeline import OnnxRun


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../secret.onnx", "models/../../x", "\\\\host\\share", "C:\\m.onnx"]
)
def test_a_model_outside_the_models_directory_is_refused_at_the_schema(name: str) -> None:
    with pytest.raises(ValidationError, match="relative to the agent's models directory"):
        OnnxRun.model_validate({"model": name})


@pytest.mark.parametrize("name", ["tiny_cnn", "sub/model.onnx", "digits@" + "a" * 64])
def test_a_model_named_inside_it_is_accepted(name: str) -> None:
    assert OnnxRun.model_validate({"model": name}).model == name


def test_the_agent_never_resolves_a_name_outside_its_directories(tmp_path: Path) -> None:
    outside = tmp_path / "outside.onnx"
    outside.write_bytes(b"not a model")
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.onnx").write_bytes(b"inside")
    assert resolve_model("m", str(models)) == (models / "m.onnx").resolve()
    assert resolve_model(str(outside), str(models)) is None  # absolute
    assert resolve_model("../outside.onnx", str(models)) is None  # out of the models dir
    assert resolve_model(str(outside.with_suffix("")), None) is None  # out of the built-ins
