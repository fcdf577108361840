"""The handwritten-digits demo data: decode, split, preprocess and score. Pure functions on bytes
and numpy arrays (only `dataset_bytes` reads a file), usable as `python` task entries.

The data is the UCI "Optical Recognition of Handwritten Digits" test set shipped in
`edge_agent/data/digits/` (CC BY 4.0; provenance in its README): 1,797 images of 8x8 pixel
counts 0..16 with their labels. The model `edge_agent/models/digits.onnx` is trained on the
"train" part of `split` and scored on the "test" part (`tools/train_digits.py`).
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path
from typing import Literal, TypedDict

import numpy as np
from numpy.typing import ArrayLike, NDArray

DATA_FILE = Path(__file__).resolve().parent / "data" / "digits" / "digits.csv.gz"
PIXELS = 64  # an 8x8 image, row-major
CLASSES = 10
MAX_COUNT = 16  # each pixel counts the set bits of a 4x4 block
SPLIT_SEED = 0
TRAIN_FRACTION = 0.8
#: Bounds on what `decode` accepts (the shipped file is 265 KB as text).
MAX_TEXT_BYTES = 16 << 20
MAX_IMAGES = 100_000

Part = Literal["all", "train", "test"]


class Digits(TypedDict):
    """Images and their labels, row for row (a plain dict of arrays: a python task returning it
    gives an `.npz` value whose members are `pixels` and `labels`)."""

    pixels: NDArray[np.uint8]  # [N, 64], values 0..16
    labels: NDArray[np.int64]  # [N], values 0..9


class Score(TypedDict):
    """Predictions scored against true labels (plain JSON: a python task's result)."""

    images: int
    correct: int
    accuracy: float
    confusion: list[list[int]]  # rows: true digit; columns: predicted digit
    recall: list[float | None]  # per digit; None for a digit with no images
    summary: str


def dataset_bytes() -> bytes:
    """The shipped data set, gzip-compressed CSV as it lies in the package."""
    return DATA_FILE.read_bytes()


def split(
    n: int, seed: int = SPLIT_SEED, train_fraction: float = TRAIN_FRACTION
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Row indices of the train and test parts of `n` rows: a seeded shuffle cut at
    `train_fraction`, each part in file order. Same arguments, same parts, on any machine."""
    if n < 0 or not 0.0 <= train_fraction <= 1.0:
        raise ValueError("need n >= 0 and train_fraction in [0, 1]")
    order = np.random.default_rng(seed).permutation(n)
    cut = int(n * train_fraction)
    return np.sort(order[:cut]).astype(np.int64), np.sort(order[cut:]).astype(np.int64)


def decode(data: bytes, part: Part = "all") -> Digits:
    """CSV rows of 64 pixel counts then the label, gzip-compressed or plain, into arrays.

    `part` keeps the rows of that part of `split(rows)` ("all" keeps every row): on the shipped
    file, "test" is the held-out part the model never saw in training. Raises ValueError on
    anything but well-formed rows within the bounds above.
    """
    if part not in ("all", "train", "test"):
        raise ValueError(f"part must be all, train or test, not {part!r}")
    text = gunzip(data) if data[:2] == b"\x1f\x8b" else bytes(data)
    if not text.strip():
        return Digits(pixels=np.zeros((0, PIXELS), np.uint8), labels=np.zeros(0, np.int64))
    if len(text) > MAX_TEXT_BYTES:
        raise ValueError(f"CSV text over {MAX_TEXT_BYTES} bytes")
    if text.count(b"\n") > MAX_IMAGES:
        raise ValueError(f"more than {MAX_IMAGES} rows")
    try:
        rows = np.loadtxt(io.BytesIO(text), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise ValueError(f"not a digits CSV: {exc}") from None
    if rows.shape[1] != PIXELS + 1:
        raise ValueError(f"rows have {rows.shape[1]} columns, not {PIXELS + 1}")
    pixels, labels = rows[:, :PIXELS], rows[:, PIXELS]
    if pixels.size and (pixels.min() < 0 or pixels.max() > MAX_COUNT):
        raise ValueError(f"pixel counts outside 0..{MAX_COUNT}")
    if labels.size and (labels.min() < 0 or labels.max() >= CLASSES):
        raise ValueError(f"labels outside 0..{CLASSES - 1}")
    if part != "all":
        train, test = split(len(rows))
        keep = train if part == "train" else test
        pixels, labels = pixels[keep], labels[keep]
    return Digits(pixels=pixels.astype(np.uint8), labels=labels.astype(np.int64))


def gunzip(data: bytes, limit: int = MAX_TEXT_BYTES) -> bytes:
    """Decompress gzip `data`, refusing to produce more than `limit` bytes."""
    d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"not gzip data: {exc}") from None
    if len(out) > limit:
        raise ValueError(f"gzip data expands past {limit} bytes")
    if not d.eof:
        raise ValueError("gzip data is truncated")
    return out


def preprocess(pixels: ArrayLike) -> NDArray[np.float32]:
    """Pixel counts [N, 64] (0..16) to the model's input `pixels`: float32 in [0, 1]."""
    arr = np.asarray(pixels)
    if arr.ndim != 2 or arr.shape[1] != PIXELS:
        raise ValueError(f"pixels must be [N, {PIXELS}], got {list(arr.shape)}")
    if arr.size and (arr.min() < 0 or arr.max() > MAX_COUNT):
        raise ValueError(f"pixel counts outside 0..{MAX_COUNT}")
    out: NDArray[np.float32] = arr.astype(np.float32) / np.float32(MAX_COUNT)
    return out


def confusion(predicted: ArrayLike, labels: ArrayLike) -> NDArray[np.int64]:
    """10x10 counts: row = true digit, column = predicted digit."""
    arrays = [np.asarray(predicted).reshape(-1), np.asarray(labels).reshape(-1)]
    for arr in arrays:
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"digits must be integers, got {arr.dtype}")
    pred, true = (a.astype(np.int64, copy=False) for a in arrays)
    if pred.shape != true.shape:
        raise ValueError(f"{pred.size} predictions for {true.size} labels")
    for name, arr in (("predictions", pred), ("labels", true)):
        if arr.size and (arr.min() < 0 or arr.max() >= CLASSES):
            raise ValueError(f"{name} outside 0..{CLASSES - 1}")
    counts = np.zeros((CLASSES, CLASSES), dtype=np.int64)
    np.add.at(counts, (true, pred), 1)
    return counts


def aggregate(predicted: ArrayLike, labels: ArrayLike) -> Score:
    """Score predicted digits against true labels: counts, accuracy, the confusion matrix,
    recall per digit and a short summary for a person."""
    counts = confusion(predicted, labels)
    images = int(counts.sum())
    correct = int(np.trace(counts))
    per_digit = counts.sum(axis=1)
    recall = [float(counts[d, d] / per_digit[d]) if per_digit[d] else None for d in range(CLASSES)]
    return Score(
        images=images,
        correct=correct,
        accuracy=correct / images if images else 0.0,
        confusion=counts.tolist(),
        recall=recall,
        summary=summary(counts),
    )


def summary(counts: NDArray[np.int64], top: int = 3) -> str:
    """Accuracy and the most frequent mistakes of a confusion matrix, in words."""
    images = int(counts.sum())
    correct = int(np.trace(counts))
    if images == 0:
        return "no images scored"
    head = f"{correct} of {images} digits right ({100.0 * correct / images:.1f}%)"
    off = counts.copy()
    np.fill_diagonal(off, 0)
    # most frequent first; ties by true digit, then predicted digit
    mistakes = sorted(
        ((int(off[t, p]), t, p) for t in range(CLASSES) for p in range(CLASSES) if off[t, p]),
        key=lambda m: (-m[0], m[1], m[2]),
    )[:top]
    if not mistakes:
        return head + "; no mistakes"
    words = ", ".join(f"{t} read as {p} ({n} image{'s' if n > 1 else ''})" for n, t, p in mistakes)
    return f"{head}; most frequent mistakes: {words}"


def confusion_table(counts: NDArray[np.int64]) -> str:
    """The confusion matrix as aligned text: one row per true digit, one column per prediction."""
    width = max(3, len(str(int(counts.max(initial=0)))) + 1)
    lines = ["true\\pred" + "".join(f"{p:>{width}}" for p in range(CLASSES))]
    for t in range(CLASSES):
        lines.append(f"{t:>9}" + "".join(f"{int(c):>{width}}" for c in counts[t]))
    return "\n".join(lines)
