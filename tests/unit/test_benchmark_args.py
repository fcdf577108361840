"""Benchmark options: the placement benchmark's `--paced` list (one paced phase per rate) and
the lists of counts other benchmarks take; the placement benchmark's traffic per process kind;
the booking stress's outage length."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import booking_stress
from benchmarks.common import counts
from benchmarks.placement_latency import against_goal, by_kind, paced_name, paced_rates


@pytest.mark.parametrize(
    ("text", "rates"),
    [("1000", [1000.0]), ("250,500, 1000", [250.0, 500.0, 1000.0]), ("0", []), ("", [])],
)
def test_paced_rates_are_a_comma_separated_list_zero_meaning_none(
    text: str, rates: list[float]
) -> None:
    assert paced_rates(text) == rates


@pytest.mark.parametrize("text", ["fast", "500,x", "-1", "nan", "inf"])
def test_paced_rates_refuse_what_is_not_a_rate(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        paced_rates(text)


def test_a_paced_phase_is_named_by_its_pipelines_per_second() -> None:
    assert paced_name(1000.0, 20) == "paced 50/s"
    assert paced_name(250.0, 20) == "paced 12.5/s"


def test_counts_are_a_comma_separated_list_of_positive_integers() -> None:
    assert counts("10,100, 1000") == [10, 100, 1000]
    for bad in ("", "ten", "5,0", "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            counts(bad)


def test_traffic_of_agents_counts_own_and_shared_connections_alike() -> None:
    per_conn = {
        "mars-agent-pl0-0001": (3, 4),
        "mars-agents-pl1": (10, 20),  # a process's agents on one shared connection
        "mars-orchestrator": (5, 6),
        "mars-client": (1, 1),
        "tap": (0, 7),
    }
    assert by_kind(per_conn) == {
        "agents": (13, 24),
        "orchestrator": (5, 6),
        "benchmark client": (1, 1),
        "other": (0, 7),
    }


@pytest.mark.parametrize(
    "argv", [["--server-down", "5"], ["--restart-server-after", "8", "--server-down", "-1"]]
)
def test_the_stress_refuses_an_outage_length_without_a_restart_or_below_zero(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        booking_stress.main(argv)
    assert exit_.value.code == 2
    assert "--server-down S needs S >= 0 and --restart-server-after" in capsys.readouterr().err


def test_the_stress_refuses_a_negative_cancel_interval(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        booking_stress.main(["--cancel-every", "-1"])
    assert exit_.value.code == 2
    assert "--cancel-every must be >= 0" in capsys.readouterr().err


def test_each_phase_says_whether_its_p99_met_the_goal() -> None:
    assert against_goal(8.9) == ("met", "10.0x")
    assert against_goal(10.0) == ("met", "8.9x")  # at the goal is meeting it
    assert against_goal(14.9) == ("missed, 1.49x", "6.0x")
    assert against_goal(float("nan")) == ("-", "-")  # a phase with no timed submission
