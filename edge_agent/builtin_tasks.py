"""Small, safe entry points for `python` tasks (tests and the demo): pure, bounded, no I/O.

Allow them with `python_allow: [edge_agent.builtin_tasks]` in the agent config.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

MAX_SIDE = 4096
MAX_PAUSE_S = 30.0


def checksum(text: str = "", algo: str = "sha256", repeat: int = 1) -> str:
    """Hex digest of `text` repeated `repeat` times (a CPU-bound stand-in for hashing data)."""
    if algo not in ("sha256", "sha1", "md5", "blake2b"):
        raise ValueError(f"unsupported algorithm {algo!r}")
    if not 1 <= repeat <= 1_000_000:
        raise ValueError("repeat must be in [1, 1000000]")
    h = hashlib.new(algo)
    data = text.encode()
    for _ in range(repeat):
        h.update(data)
    return h.hexdigest()


def resize(
    width: int = 64, height: int = 64, out_width: int = 32, out_height: int = 32, seed: int = 0
) -> bytes:
    """A seeded random grey image of width x height, resized (nearest) to out_width x out_height;
    returns the raw uint8 pixels."""
    for side in (width, height, out_width, out_height):
        if not 1 <= side <= MAX_SIDE:
            raise ValueError(f"image sides must be in [1, {MAX_SIDE}]")
    img = np.random.default_rng(seed).integers(0, 256, size=(height, width), dtype=np.uint8)
    rows = np.arange(out_height) * height // out_height
    cols = np.arange(out_width) * width // out_width
    return img[rows][:, cols].tobytes()


def describe(**kwargs: str | int | float | bool) -> dict[str, object]:
    """Echo the arguments back as JSON (shows how a dict result is encoded)."""
    return {"kwargs": kwargs, "count": len(kwargs)}


def pause(seconds: float = 0.1) -> str:
    """Hold a worker for `seconds` (bounded): lets tests observe concurrency and timeouts."""
    seconds = min(max(0.0, float(seconds)), MAX_PAUSE_S)
    time.sleep(seconds)
    return f"paused {seconds:g} s"


def scale(x: np.ndarray, by: float = 1.0) -> np.ndarray:
    """`x / by` as float32: a tensor from upstream made ready for a model."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a tensor (an .npy value), not {type(x).__name__}")
    if by == 0:
        raise ValueError("by must not be 0")
    return (x / by).astype(np.float32)


def image_batch(n: int = 4, side: int = 32, seed: int = 0) -> np.ndarray:
    """`n` seeded random RGB images, uint8 [n, 3, side, side]: a source of tensors."""
    if not 1 <= n <= 4096 or not 1 <= side <= MAX_SIDE:
        raise ValueError(f"n must be in [1, 4096] and side in [1, {MAX_SIDE}]")
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3, side, side), dtype=np.uint8)
