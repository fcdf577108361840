"""The data-transfer benchmark's options and report: `--set` agent settings checked against the
agent config, `--size-mb` bounded by what a task may output, and the ratio against the goal."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.data_transfer import (
    MB,
    Run,
    median_run,
    parse_args,
    phase_rows,
    ratio_line,
    report,
    setting,
    size_mb,
)


def test_a_setting_is_an_agent_config_key_and_a_value_of_its_type() -> None:
    assert setting("object_chunk_bytes=1048576") == ("object_chunk_bytes", 1048576)
    assert setting(" object_ttl_s = 60.5") == ("object_ttl_s", 60.5)
    assert setting("buffer_fsync=true") == ("buffer_fsync", True)


@pytest.mark.parametrize(
    "text", ["object_chunk_bytes", "=5", "no_such_key=1", "object_chunk_bytes=12", "tier=moon"]
)
def test_a_setting_the_agent_would_refuse_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        setting(text)


def test_a_size_is_in_mb_of_a_million_bytes_up_to_the_largest_output() -> None:
    assert size_mb("100") == 100 * MB
    assert size_mb("0.5") == MB // 2
    for bad in ("0", "x", "300", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            size_mb(bad)


def test_options_default_to_100_mb_three_runs_and_no_settings() -> None:
    args = parse_args([])
    assert (args.size, args.repeat, args.sets) == (100 * MB, 3, {})
    args = parse_args(["--size-mb", "20", "--repeat", "5", "--set", "object_chunk_bytes=65536"])
    assert (args.size, args.repeat, args.sets) == (20 * MB, 5, {"object_chunk_bytes": 65536})
    for bad in (["--repeat", "0"], ["--set", "nope=1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_the_ratio_is_of_throughputs_against_the_goal_of_one_half() -> None:
    # 2 s against 1 s: half the throughput, just the goal
    assert ratio_line(2.0, 1.0) == "MARS / plain NATS: 0.50 (goal >= 0.50: met)"
    assert ratio_line(4.0, 1.0, (3.0, 0.9)) == (
        "MARS / plain NATS: 0.25 (goal >= 0.50: NOT met); best runs: 0.30"
    )


def test_the_median_run_is_the_lower_middle_one() -> None:
    runs = [Run(w, {}) for w in (3.0, 1.0, 2.0, 4.0)]
    assert median_run(runs).wall_s == 2.0
    assert median_run(runs[:3]).wall_s == 2.0


def test_the_report_gives_throughput_cpu_and_where_the_time_went() -> None:
    marks = {"out": 10.0, "put0": 10.0, "keep0": 10.07, "keep1": 10.1, "put1": 10.4,
             "get0": 10.4, "get1": 10.7, "delivered": 10.8}  # fmt: skip
    mars = [Run(0.8, {"A": 0.2, "B": 0.3, "nats-server": 0.1}, marks)]
    plain = [Run(0.4, {"A": 0.1, "B": 0.1, "nats-server": 0.1})]
    assert [r[0] for r in phase_rows(mars)] == [
        "output to its put (A)", "object put (A)", "sha256 + keep, beside the put (A)",
        "reference to B", "object get (B)", "check + deliver (B)",
    ]  # fmt: skip
    assert phase_rows(mars)[1][1] == pytest.approx(400.0)
    assert phase_rows(mars)[2][1] == pytest.approx(100.0)
    out = report(100 * MB, mars, plain, "a note").splitlines()
    assert out[0] == "100 MB from agent A to agent B, a note; median of 1 runs"
    mars_row = next(line.split() for line in out if line.startswith("MARS data plane"))
    assert mars_row[3:6] == ["125.0", "125.0", "0.800"]  # MB/s, best MB/s, seconds
    assert mars_row[-1] == "0.600"  # CPU of all three processes
    assert "MARS / plain NATS: 0.50 (goal >= 0.50: met); best runs: 0.50" in out
