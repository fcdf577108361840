"""The profiler's timing rules (tools.predictor_profile.measure_rows) on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tools.predictor_profile import RowTiming, measure_rows, pair_gap, row_keys, sized_iterations


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def task(clock: Clock, log: list[str], key: str, durations: Iterator[float]) -> Callable[[], None]:
    def run() -> None:
        clock.now += next(durations)
        log.append(key)

    return run


def const(s: float) -> Iterator[float]:
    while True:
        yield s


def test_short_runs_are_wrapped_until_a_call_lasts_the_minimum() -> None:
    clock, log = Clock(), list[str]()
    # 0.2 ms per run: 1.2 * 5 ms / 0.2 ms = 30 runs per call (6 ms)
    assert sized_iterations(task(clock, log, "a", const(2e-4)), 5e-3, clock) == 30
    # probes say 1 ms (-> 6 runs), but runs then take 0.5 ms: 3 ms < 5 ms, so it grows to
    # ceil(6 * 1.2 * 5 / 3) = 12 runs (6 ms) and stops there
    durations = iter([1e-3] * 3 + [5e-4] * 100)
    assert sized_iterations(task(clock, log, "b", durations), 5e-3, clock) == 12
    # a run already longer than the minimum is not wrapped
    assert sized_iterations(task(clock, log, "c", const(8e-3)), 5e-3, clock) == 1


def test_rounds_interleave_rows_and_alternate_direction() -> None:
    clock, log = Clock(), list[str]()
    rows = {k: task(clock, log, k, const(1e-2)) for k in "abc"}
    measure_rows(rows, rounds=4, calls=2, warmup=1, clock=clock)
    timed = log[3 + 3 * 4 :]  # after 1 warm-up and 3 probes + 1 sizing run per row
    fwd, rev = list("aabbcc"), list("ccbbaa")
    assert timed == fwd + rev + fwd + rev


def test_label_is_the_minimum_and_passes_split_odd_and_even_rounds() -> None:
    clock, log = Clock(), list[str]()
    per_round = [[5.0, 4.0], [6.0, 7.0], [4.5, 3.9], [6.5, 6.2]]  # ms, rounds 1..4
    timed = iter([x / 1e3 for r in per_round for x in r])
    warm = iter([1e-2] * 5)  # 1 warm-up, 3 probes, 1 sizing run (10 ms: no wrapping)
    durations = iter([*warm, *timed])
    out = measure_rows(
        {"a": task(clock, log, "a", durations)},
        rounds=4, calls=2, warmup=1, clock=clock, tolerance=1.0,
    )  # fmt: skip
    rt = out["a"]
    assert rt.iters == 1 and rt.runs == 8 and rt.remeasured == 0
    assert rt.label == pytest.approx(3.9e-3)
    assert rt.passes() == pytest.approx((3.9e-3, 6.0e-3))  # min of rounds 1+3, of 2+4
    assert rt.median == pytest.approx(5.5e-3)


def test_rows_whose_passes_disagree_are_remeasured_and_the_rest_are_not() -> None:
    clock, log = Clock(), list[str]()
    setup = [1e-2] * 5
    # "noisy": its even rounds run 10 % slow the first time, then agree
    first = [1e-2, 1e-2, 1.1e-2, 1.1e-2, 1e-2, 1e-2, 1.1e-2, 1.1e-2]
    noisy = iter(setup + first + [1e-2] * 8)
    rows = {
        "steady": task(clock, log, "steady", const(1e-2)),
        "noisy": task(clock, log, "noisy", noisy),
    }
    out = measure_rows(rows, rounds=4, calls=2, warmup=1, clock=clock, tolerance=0.05)
    assert out["steady"].remeasured == 0 and out["steady"].runs == 8
    assert out["noisy"].remeasured == 1 and out["noisy"].runs == 16
    assert out["noisy"].passes(0) == pytest.approx((1e-2, 1.1e-2))
    assert out["noisy"].passes() == pytest.approx((1e-2, 1e-2))
    # only the disagreeing row ran in the second attempt
    assert log.count("steady") == 5 + 8 and log.count("noisy") == 5 + 16


def test_remeasuring_stops_after_the_limit() -> None:
    clock, log = Clock(), list[str]()
    slow_even = iter([1e-2] * 5 + ([1e-2] * 2 + [2e-2] * 2) * 100)
    out = measure_rows(
        {"a": task(clock, log, "a", slow_even)},
        rounds=4, calls=2, warmup=1, clock=clock, max_remeasure=2,
    )  # fmt: skip
    assert out["a"].remeasured == 2 and len(out["a"].attempts) == 3


def test_too_few_calls_or_odd_rounds_are_refused() -> None:
    with pytest.raises(ValueError):
        measure_rows({}, rounds=2, calls=3)  # 6 timed calls < 7
    with pytest.raises(ValueError):
        measure_rows({}, rounds=3, calls=3)  # passes need an even number of rounds


def test_pair_gap_is_relative_to_the_smaller_pass() -> None:
    assert pair_gap(1.0, 1.05) == pytest.approx(0.05)
    assert pair_gap(1.05, 1.0) == pytest.approx(0.05)
    assert RowTiming(1, [[[1.0], [2.0]]]).passes() == (1.0, 2.0)


def test_rows_are_grouped_by_configuration_behind_the_reference_kernel() -> None:
    assert row_keys(["m", "n"], [1, 2], [1, 8]) == [
        ("cal_matmul", 1, 1), ("m", 1, 1), ("m", 1, 8), ("n", 1, 1), ("n", 1, 8),
        ("cal_matmul", 2, 1), ("m", 2, 1), ("m", 2, 8), ("n", 2, 1), ("n", 2, 8),
    ]  # fmt: skip
