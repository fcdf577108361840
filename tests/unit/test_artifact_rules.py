"""Artifact names and refs, what a put infers from a file, and who may run shipped code."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from console.artifacts import ArtifactsError, default_name, kind_of
from edge_agent.allowlist import SHIPPED_CODE_OFF, Allowlist
from edge_agent.config import AgentConfig
from schemas.artifacts import ArtifactInfo, parse_ref
from schemas.codec import decode, encode
from schemas.pipeline import OnnxRun, PythonRun, artifact_of

SHA = "ab" * 32


def test_a_ref_is_a_name_and_a_full_lower_case_digest() -> None:
    ref = parse_ref(f"resnet-50_v2@{SHA}")
    assert ref is not None and (ref.name, ref.sha256) == ("resnet-50_v2", SHA)
    assert str(ref) == f"resnet-50_v2@{SHA}"
    for text in ("tiny_cnn", f"@{SHA}", f"a.b@{SHA}", f"x@{SHA[:-1]}", f"x@{SHA.upper()}", "x@"):
        assert parse_ref(text) is None, text


def test_onnx_and_python_runs_name_artifacts() -> None:
    assert artifact_of(OnnxRun(model=f"m@{SHA}")) == (f"m@{SHA}", "onnx")
    assert artifact_of(OnnxRun(model="tiny_cnn")) is None  # a built-in model: no fetch
    run = PythonRun(entry="pkg.mod:fn", bundle=f"b@{SHA}")
    assert artifact_of(run) == (f"b@{SHA}", "python-bundle")
    assert OnnxRun(model=f"m@{SHA}", sha256=SHA).sha256 == SHA
    with pytest.raises(ValidationError, match="is not the digest model"):
        OnnxRun(model=f"m@{SHA}", sha256="cd" * 32)
    with pytest.raises(ValidationError):
        PythonRun(entry="pkg.mod:fn", bundle="just-a-name")


def test_shipped_code_runs_only_where_the_owner_allows_it() -> None:
    shipped = PythonRun(entry="pkg.mod:fn", bundle=f"b@{SHA}")
    assert AgentConfig().allow_shipped_code is False
    assert Allowlist().problem(shipped) == SHIPPED_CODE_OFF
    assert "allow_shipped_code" in SHIPPED_CODE_OFF
    assert Allowlist(python_modules=("pkg",)).problem(shipped) == SHIPPED_CODE_OFF
    allowed = Allowlist(shipped_code=True)
    assert allowed.problem(shipped) is None  # its module needs no python_allow entry
    assert "private" in (allowed.problem(shipped.model_copy(update={"entry": "m:_f"})) or "")
    # allowing shipped code allows nothing installed beyond python_allow
    assert allowed.problem(PythonRun(entry="os:system")) == "module 'os' is not allowlisted"


def test_a_put_takes_kind_and_name_from_the_file(tmp_path: Path) -> None:
    model = tmp_path / "yolo v8.n.onnx"
    model.write_bytes(b"x")
    assert (kind_of(model), default_name(model)) == ("onnx", "yolo-v8-n")
    wheel = tmp_path / "mypkg-1.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("mypkg/__init__.py", "")
    assert (kind_of(wheel), default_name(wheel)) == ("python-bundle", "mypkg")
    fake = tmp_path / "notes.zip"
    fake.write_bytes(b"not a zip")
    with pytest.raises(ArtifactsError, match="not a zip archive"):
        kind_of(fake)
    with pytest.raises(ArtifactsError, match="say --kind"):
        kind_of(tmp_path / "model.bin")


def test_an_entry_reads_back_as_written() -> None:
    info = ArtifactInfo(name="m", sha256=SHA, size=3, kind="onnx", created=1.7e9)
    assert decode(encode(info), ArtifactInfo) == info and info.ref == f"m@{SHA}"
