"""The placement benchmark's CPU accounting: every process on the host, and the floor it sets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.booking_stress import Services
from benchmarks.placement_latency import Phase, host_note, own_cpu_note, stored_note


def test_a_watched_process_is_counted_with_the_children(tmp_path: Path) -> None:
    with Services(tmp_path) as services:
        assert services.cpu_seconds() == {}
        services.watch("benchmark", os.getpid())
        sum(i * i for i in range(200_000))  # some CPU of our own to count
        got = services.cpu_seconds()
    assert set(got) == {"benchmark"}
    assert got["benchmark"] > 0.0


def test_host_note_spreads_all_processes_cpu_over_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    phase = Phase(latencies_s=[0.01] * 10, wall_s=0.2, cpu_s={"a": 0.12, "b": 0.06})
    # 0.18 s over 10 pipelines: 18 ms each; 0.18 s of 2 x 0.2 s: 45% busy; 9 ms on 2 cores
    assert host_note(phase) == (
        "all processes 18.0 ms CPU per pipeline, 45% of 2 cores over the phase "
        "(a floor of 9.0 ms per pipeline when they are all busy)"
    )


def test_own_cpu_note_counts_only_the_orchestrator_processes() -> None:
    phase = Phase(
        latencies_s=[0.01] * 10, wall_s=0.2, placed_tasks=200,
        cpu_s={"orchestrator": 0.1, "orchestrator-1": 0.1, "sim-agents": 5.0},
    )  # fmt: skip
    # 0.2 s of orchestrator CPU for 10 pipelines of 200 placements: 20 ms each, 1,000 per s
    assert own_cpu_note(phase, 2) == (
        "orchestrator CPU 20.0 ms per pipeline: 1,000 placements per CPU-second of "
        "orchestrator (derived: the rate of one process with a core to itself, each of 2)"
    )
    assert own_cpu_note(Phase(latencies_s=[0.01], cpu_s={"sim-agents": 1.0}), 1) == (
        "orchestrator CPU: not measured"
    )


def test_stored_note_gives_each_streams_stores_per_pipeline_busiest_first() -> None:
    stored = {"MARS_EVENTS": 44.0, "KV_MARS_BOOKINGS": 12.0, "KV_MARS_OWNERS": 0.0}
    assert stored_note(stored, 2) == (
        "JetStream stores per pipeline (server's count): 28.0: MARS_EVENTS 22.0, MARS_BOOKINGS 6.0"
    )
