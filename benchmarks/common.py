"""Small helpers shared by the benchmark commands: timing, tables and option lists."""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def timed(
    fn: Callable[[], T],
    repeat: int = 1,
    min_total_s: float = 0.0,
    max_runs: int = 100,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[T, float]:
    """Result of the last call and the best wall time of at least `repeat` calls, in seconds;
    fast functions are called again until `min_total_s` has been spent (at most `max_runs`).
    `clock=time.thread_time` times CPU time instead (what neighbours on a busy host cannot
    stretch).

    As `timeit` does, the garbage collector is paused during each call (and run once before),
    so one side of a comparison is not charged for the other's garbage.
    """
    best = float("inf")
    out: T | None = None
    runs, total = 0, 0.0
    gc.collect()
    while runs < max(1, repeat) or (total < min_total_s and runs < max_runs):
        gc.disable()
        try:
            t0 = clock()
            out = fn()
            dt = clock() - t0
        finally:
            gc.enable()
        best = min(best, dt)
        runs += 1
        total += dt
    assert out is not None
    return out, best


def samples(fn: Callable[[], T], repeat: int) -> tuple[T, list[float]]:
    """Result of the last call and every call's wall time, in seconds."""
    times: list[float] = []
    out: T | None = None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    assert out is not None
    return out, times


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c: object) -> str:
    if isinstance(c, float):
        if c != c:
            return "nan"
        if abs(c) >= 1000:
            return f"{c:,.0f}"
        if abs(c) >= 10:
            return f"{c:.1f}"
        return f"{c:.3f}"
    return str(c)


def progress(msg: str) -> None:
    """Progress on stderr, so stdout stays a clean report."""
    print(msg, file=sys.stderr, flush=True)


def counts(text: str) -> list[int]:
    """An option's comma-separated list of counts, each >= 1 (`type=` for argparse)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if min(out) < 1:
        raise argparse.ArgumentTypeError(f"counts must be >= 1: {text!r}")
    return out
