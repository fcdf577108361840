"""Shipped config and pipeline files stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from console.pipeline_files import load_pipeline
from edge_agent.config import load_config
from schemas.codec import DecodeError

REPO = Path(__file__).resolve().parents[2]


def test_example_agent_config_loads_and_marks_emulated_devices() -> None:
    cfg = load_config(REPO / "deploy" / "agent.example.yaml")
    assert cfg.site == "plant-a" and cfg.devices[0].emulated is True


def test_example_pipeline_loads() -> None:
    spec = load_pipeline(REPO / "console" / "examples" / "video-analytics.yaml")
    assert spec.tasks[0].id == "decode"
    assert any(t.run.kind == "onnx" for t in spec.tasks)


def test_bad_yaml_is_a_coded_error(tmp_path: Path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(DecodeError) as err:
        load_pipeline(p)
    assert err.value.code == "bad_request"


def test_names_and_ids_are_strings_whatever_yaml_reads_them_as(tmp_path: Path) -> None:
    """YAML 1.1 reads `off`, `yes`, `on`, `no` as booleans and `1`, `2.5` as numbers: a
    pipeline called `off` was refused (`name: Input should be a valid string`). Where the
    model wants a string, the scalar is taken as written; elsewhere YAML's reading stands."""
    p = tmp_path / "off.yaml"
    p.write_text(
        "name: off\n"
        "preemptible: yes\n"  # a bool field: YAML 1.1's `yes` is still true
        "tasks:\n"
        "  - id: 1\n"
        "    run: {kind: exec, argv: [echo, on, 007]}\n"
        "  - id: no\n"
        "    deps: [1]\n"
        "    requires: {labels: {zone: 2.50}}\n"
        "    run: {kind: python, entry: 'm:f', kwargs: {n: 3, flag: on}}\n"
    )
    spec = load_pipeline(p)
    assert spec.name == "off" and spec.preemptible is True
    one, two = spec.tasks
    assert (one.id, two.id, two.deps) == ("1", "no", ["1"])
    assert one.run.argv == ["echo", "on", "007"]  # type: ignore[union-attr]
    assert two.requires.labels == {"zone": "2.50"}
    assert two.run.kwargs == {"n": 3, "flag": True}  # type: ignore[union-attr]  # any scalar
    for name in ("yes", "on", "no", "Off", "1", "2024-05-01"):
        p.write_text(f"name: {name}\ntasks: [{{id: a, run: {{kind: synthetic}}}}]\n")
        assert load_pipeline(p).name == name


def test_a_yaml_value_that_is_no_string_where_one_is_wanted_is_still_refused(
    tmp_path: Path,
) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("name: [a, b]\ntasks: [{id: 1.5, run: {kind: synthetic}}]\n")
    with pytest.raises(DecodeError) as err:
        load_pipeline(p)
    assert err.value.code == "invalid"
    assert set(err.value.details) == {"name", "tasks.0.id"}, err.value.details
