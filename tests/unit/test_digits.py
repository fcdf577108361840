"""The shipped digits data and model: files match their stated sha256, the model scores on the
held-out part what its card says (with the real ONNX Runtime), the training script rebuilds the
same classifier, and the decode / preprocess / aggregate helpers on hand-checked cases."""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edge_agent import digits
from edge_agent.executors import BUILTIN_MODELS, resolve_model

REPO = Path(__file__).resolve().parents[2]
MODEL = BUILTIN_MODELS / "digits.onnx"
CARD = BUILTIN_MODELS / "digits.card.json"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_model(path: Path, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    probs, label = sess.run(["probabilities", "label"], {"pixels": pixels})
    return np.asarray(probs), np.asarray(label)


@pytest.fixture(scope="module")
def card() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(CARD.read_text())
    return loaded


@pytest.fixture(scope="module")
def held_out() -> digits.Digits:
    return digits.decode(digits.dataset_bytes(), part="test")


def csv_rows(*rows: tuple[list[int], int]) -> bytes:
    return "".join(",".join(map(str, [*px, label])) + "\n" for px, label in rows).encode()


# -- the shipped files ---------------------------------------------------------------------------
def test_shipped_data_is_the_file_its_readme_and_card_name(card: dict[str, Any]) -> None:
    data_sha = sha256(digits.DATA_FILE)
    assert data_sha in (digits.DATA_FILE.parent / "README.md").read_text()
    assert card["data"]["sha256"] == data_sha
    d = digits.decode(digits.dataset_bytes())
    assert d["pixels"].shape == (1797, 64) and d["labels"].shape == (1797,)
    assert np.bincount(d["labels"]).min() >= 170  # about 180 images of every digit


def test_shipped_model_sha256_matches_its_card(card: dict[str, Any]) -> None:
    assert resolve_model("digits", None) == MODEL
    assert card["sha256"] == sha256(MODEL)
    assert card["bytes"] == MODEL.stat().st_size


def test_shipped_model_scores_on_the_held_out_part_what_its_card_states(
    card: dict[str, Any], held_out: digits.Digits
) -> None:
    probs, label = run_model(MODEL, digits.preprocess(held_out["pixels"]))
    assert probs.shape == (360, 10) and probs.dtype == np.float32
    assert label.shape == (360,) and label.dtype == np.int64
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert (probs.argmax(axis=1) == label).all()
    scored = digits.aggregate(label, held_out["labels"])
    assert card["split"]["test_images"] == scored["images"] == 360
    assert scored["accuracy"] == card["held_out"]["accuracy"]
    assert scored["confusion"] == card["held_out"]["confusion"]
    assert scored["accuracy"] >= 0.9  # a real classifier, not chance (0.1)


def test_the_predictor_has_the_shipped_models_features(card: dict[str, Any]) -> None:
    """Rebuilding the model means refreshing the predictor's features file too."""
    from orchestrator.predictor.features import shipped_book

    assert shipped_book().get("digits", 8, sha256=card["sha256"]) is not None


def test_package_data_ships_the_data_model_and_card() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["edge_agent"]
    pkg = REPO / "edge_agent"
    for f in (digits.DATA_FILE, digits.DATA_FILE.parent / "README.md", MODEL, CARD):
        rel = f.relative_to(pkg).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel


def test_the_training_script_rebuilds_the_same_classifier(
    tmp_path: Path, card: dict[str, Any], held_out: digits.Digits
) -> None:
    """The card's command, into a temp dir: same predictions on the held-out part, the same
    probabilities to float rounding (bytes may differ across CPUs and library versions)."""
    cmd = [sys.executable, str(REPO / "tools" / "train_digits.py"), "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60, cwd=REPO)
    x = digits.preprocess(held_out["pixels"])
    probs, label = run_model(tmp_path / "digits.onnx", x)
    want_probs, want_label = run_model(MODEL, x)
    assert (label == want_label).all()
    np.testing.assert_allclose(probs, want_probs, atol=1e-5)
    rebuilt = json.loads((tmp_path / "digits.card.json").read_text())
    for key in ("split", "training", "held_out", "data", "inputs", "outputs"):
        assert rebuilt[key] == card[key], key


# -- helpers -------------------------------------------------------------------------------------
def test_decode_plain_and_gzip_csv() -> None:
    text = csv_rows(([0] * 63 + [16], 7), (list(range(16)) + [0] * 48, 0))
    for data in (text, gzip.compress(text)):
        d = digits.decode(data)
        assert d["pixels"].dtype == np.uint8 and d["labels"].dtype == np.int64
        assert d["pixels"].shape == (2, 64)
        assert d["labels"].tolist() == [7, 0]
        assert d["pixels"][0, 63] == 16 and d["pixels"][1, :4].tolist() == [0, 1, 2, 3]
    empty = digits.decode(b"")
    assert empty["pixels"].shape == (0, 64) and empty["labels"].shape == (0,)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (csv_rows(([0] * 63, 1)), "columns"),
        (csv_rows(([0] * 63 + [17], 1)), "pixel counts outside"),
        (csv_rows(([0] * 63 + [-1], 1)), "pixel counts outside"),
        (csv_rows(([0] * 64, 10)), "labels outside"),
        (b"0.5," * 64 + b"1\n", "not a digits CSV"),
        (gzip.compress(b"0," * 64 + b"1\n")[:-12], "truncated"),
        (b"\x1f\x8b not gzip", "not gzip data"),
        (gzip.compress(b"0" * (digits.MAX_TEXT_BYTES + 1)), "expands past"),
    ],
)
def test_decode_refuses_what_is_not_digits(data: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        digits.decode(data)


def test_split_parts_are_seeded_disjoint_and_complete() -> None:
    train, test = digits.split(1797)
    assert (len(train), len(test)) == (1437, 360)
    assert sorted([*train.tolist(), *test.tolist()]) == list(range(1797))
    assert (np.diff(train) > 0).all() and (np.diff(test) > 0).all()
    again = digits.split(1797)
    assert (again[0] == train).all() and (again[1] == test).all()
    assert not (digits.split(1797, seed=1)[1] == test).all()
    everything = digits.decode(digits.dataset_bytes())
    part = digits.decode(digits.dataset_bytes(), part="train")
    assert (part["labels"] == everything["labels"][train]).all()
    with pytest.raises(ValueError, match="part must be"):
        digits.decode(b"", part="val")  # type: ignore[arg-type]


def test_preprocess_scales_counts_to_unit_float32() -> None:
    x = digits.preprocess(np.array([[0, 8, 16] + [4] * 61], dtype=np.uint8))
    assert x.dtype == np.float32 and x.shape == (1, 64)
    assert x[0, :4].tolist() == [0.0, 0.5, 1.0, 0.25]
    with pytest.raises(ValueError, match=r"\[N, 64\]"):
        digits.preprocess(np.zeros((2, 63)))
    with pytest.raises(ValueError, match="outside"):
        digits.preprocess(np.full((1, 64), 17))


def test_aggregate_counts_a_hand_checked_case() -> None:
    #          true: 0  1  2  2  2  9
    #     predicted: 0  1  1  2  1  4
    out = digits.aggregate([0, 1, 1, 2, 1, 4], np.array([0, 1, 2, 2, 2, 9]))
    assert (out["images"], out["correct"]) == (6, 3)
    assert out["accuracy"] == 0.5
    confusion = np.array(out["confusion"])
    assert confusion.shape == (10, 10) and confusion.sum() == 6
    assert confusion[0, 0] == confusion[1, 1] == confusion[2, 2] == 1
    assert confusion[2, 1] == 2 and confusion[9, 4] == 1
    assert out["recall"] == [1.0, 1.0, 1 / 3, None, None, None, None, None, None, 0.0]
    assert out["summary"] == (
        "3 of 6 digits right (50.0%); most frequent mistakes: "
        "2 read as 1 (2 images), 9 read as 4 (1 image)"
    )
    json.dumps(out)  # a python task's result: plain JSON


def test_aggregate_edges_and_refusals() -> None:
    perfect = digits.aggregate([3, 3], [3, 3])
    assert perfect["summary"] == "2 of 2 digits right (100.0%); no mistakes"
    assert digits.aggregate([], [])["accuracy"] == 0.0
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        digits.aggregate([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="outside"):
        digits.aggregate([10], [1])
    with pytest.raises(ValueError, match="integers"):
        digits.aggregate([1.5], [1])


def test_confusion_table_reads_as_rows_of_true_digits() -> None:
    counts = digits.confusion([0, 1, 1], [0, 1, 2])
    lines = digits.confusion_table(counts).splitlines()
    assert len(lines) == 11
    assert lines[0].split() == ["true\\pred", *map(str, range(10))]
    assert lines[3].split() == ["2", "0", "1", *["0"] * 8]
