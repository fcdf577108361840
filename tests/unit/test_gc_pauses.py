"""The services' garbage-collection policy and pause log (debug, `mars.timing`), and the
latency benchmark's reading of it."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from pathlib import Path

import pytest

from benchmarks.placement_latency import gc_pauses
from orchestrator.api import submissions
from orchestrator.infra import eventloop


def test_a_long_collection_is_logged_and_a_short_one_is_not(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = eventloop.gc_pause_hook(logging.getLogger("mars.timing"))
    clock = iter([10.0, 10.5, 20.0, 20.0005])
    monkeypatch.setattr("orchestrator.infra.eventloop.time.perf_counter", lambda: next(clock))
    with caplog.at_level(logging.DEBUG, logger="mars.timing"):
        hook("start", {"generation": 2})
        hook("stop", {"generation": 2, "collected": 7})  # 500 ms
        hook("start", {"generation": 0})
        hook("stop", {"generation": 0, "collected": 0})  # 0.5 ms: below the bar
    lines = [r.getMessage() for r in caplog.records if r.name == "mars.timing"]
    assert lines == ["gc generation=2 pause_ms=500.0 collected=7"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Garbage:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def cyclic_garbage() -> weakref.ref[Garbage]:
    return weakref.ref(Garbage())


@pytest.mark.usefixtures("gc_state")
def test_paced_gc_freezes_what_exists_and_turns_the_automatic_collector_off() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    kept = [[i] for i in range(1000)]  # long-lived objects made at start-up
    paced = eventloop.PacedGc()
    paced.start()
    assert gc.get_freeze_count() >= len(kept)
    assert not gc.isenabled()
    left = cyclic_garbage()
    made = [[i] for i in range(10_000)]  # would set off young collections were it on
    assert left() is not None and len(made) == 10_000
    paced.stop()
    assert gc.isenabled()
    more = [[i] for i in range(10_000)]  # and now they do
    assert left() is None and len(more) == 10_000


@pytest.mark.usefixtures("gc_state")
def test_a_due_collection_waits_for_an_idle_moment_but_not_for_ever() -> None:
    clock, busy = Clock(), [True]
    paced = eventloop.PacedGc(
        lambda: not busy[0], every_s=60.0, idle_wait_s=10.0, most_young=10**9, clock=clock
    )
    paced.start()
    left = cyclic_garbage()
    clock.now += 59.0
    assert not paced.step() and left() is not None  # not due yet
    clock.now += 1.0
    assert not paced.step() and left() is not None  # due, but the service is busy
    busy[0] = False
    assert paced.step() and left() is None and paced.collections == 1  # idle: collected
    busy[0] = True
    left = cyclic_garbage()
    clock.now += 60.0
    assert not paced.step()  # due again, busy: it waits...
    clock.now += 9.9
    assert not paced.step() and left() is not None
    clock.now += 0.1
    assert paced.step() and left() is None  # ...at most idle_wait_s
    assert not paced.step() and paced.collections == 2  # and the next is a period away


@pytest.mark.usefixtures("gc_state")
def test_a_collection_is_due_early_once_enough_objects_were_made() -> None:
    clock = Clock()
    paced = eventloop.PacedGc(every_s=3600.0, most_young=5_000, clock=clock)
    gc.collect()  # the count starts from nothing
    paced.start()
    assert not paced.step()
    left = cyclic_garbage()
    made = [[i] for i in range(6_000)]  # more made than freed: the count the bound reads
    assert paced.step() and left() is None and len(made) == 6_000


@pytest.mark.usefixtures("gc_state")
async def test_the_paced_collector_runs_until_cancelled_and_is_handed_back_by_stop() -> None:
    ticks = asyncio.Event()

    def idle() -> bool:
        ticks.set()
        return True

    paced = eventloop.PacedGc(idle, every_s=0.0, most_young=10**9)
    task = asyncio.create_task(paced.run(tick_s=0.001))
    await asyncio.wait_for(ticks.wait(), 5.0)  # it stepped, and a collection was due
    assert not gc.isenabled() and paced.collections >= 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not gc.isenabled()  # until its owner, done serving, hands it back
    paced.stop()
    assert gc.isenabled()


def test_the_benchmark_reads_the_pauses_back(tmp_path: Path) -> None:
    log = tmp_path / "orchestrator.log"
    log.write_text(
        'ts=1 level=debug logger=mars.timing msg="gc generation=2 pause_ms=270.5 collected=0"\n'
        'ts=2 level=debug logger=mars.timing msg="placed p1 claim_ms=0.5"\n'
        'ts=3 level=debug logger=mars.timing msg="gc generation=0 pause_ms=2.1 collected=3"\n'
    )
    assert gc_pauses(log) == [(2, 270.5), (0, 2.1)]
    assert gc_pauses(tmp_path / "missing.log") == []


def test_the_benchmark_reads_each_placement_s_steps(tmp_path: Path) -> None:
    """The step names the orchestrator logs are the ones the benchmark tabulates."""
    from benchmarks.placement_latency import STEPS, step_times

    st = {"claim": 0.0005, "plan": 0.003, "send": 0.0012, "book": 0.004, "offer": 0.002}
    steps = (1e3 * v for v in st.values())
    line = submissions.TIMING_LINE % ("iso-7", *steps, 14.0, 2.0, 0, 0, 0.0, 1e9)
    log = tmp_path / "orchestrator.log"
    log.write_text(f'ts=1 level=debug logger=mars.timing msg="{line}"\n')
    got = step_times(log)["iso"]
    assert set(got) == set(STEPS)
    for k, v in st.items():
        assert got[k] == [pytest.approx(1e3 * v)]
    assert got["rest"] == [pytest.approx(14.0 - 1e3 * sum(st.values()))]


def test_steps_of_several_orchestrators_are_tabulated_together(tmp_path: Path) -> None:
    from benchmarks.placement_latency import merged_steps, step_times

    logs = []
    for k, total in enumerate((14.0, 9.0)):
        fields = (0.5, 3.0, 1.2, 4.0, 2.0, total, 2.0, 0, 0, 0.0, 1e9)
        line = submissions.TIMING_LINE % (f"lat-{k}", *fields)
        log = tmp_path / f"orchestrator-{k}.log"
        log.write_text(f'ts=1 level=debug logger=mars.timing msg="{line}"\n')
        logs.append(log)
    got = merged_steps(step_times(log) for log in logs)
    assert got["lat"]["total"] == [14.0, 9.0] and got["lat"]["plan"] == [3.0, 3.0]


def test_the_benchmark_reads_when_each_handler_started_and_splits_the_latency(
    tmp_path: Path,
) -> None:
    """The orchestrator's timing line carries when its handler was called on the host's
    monotonic clock (the client's clock too) and how long it waited for task events; a
    latency splits into the way to the handler, that wait, the handler, and the way back."""
    from benchmarks.placement_latency import handler_spans, waits

    line = submissions.TIMING_LINE % (
        "pac0-3", 0.5, 1.0, 1.0, 2.0, 0.5, 6.0, 2.0, 0, 0, 1.5, 1000.0105
    )  # fmt: skip
    log = tmp_path / "orchestrator.log"
    log.write_text(f'ts=1 level=debug logger=mars.timing msg="{line}"\n')
    spans = handler_spans(log)
    assert list(spans) == ["pac0-3"] and spans["pac0-3"] == pytest.approx((1000.0105, 1.5, 6.0))
    assert handler_spans(tmp_path / "missing.log") == {}
    # sent at 1000.0000, answered 0.0200 s later: 10.5 ms to the handler, 1.5 held for
    # events, 6 in it, 2 back
    got = waits({"pac0-3": (1000.0, 0.020), "pac0-4": (1000.1, 0.005)}, spans)
    assert len(got) == 1  # a submission without a handler line is left out
    assert got[0] == pytest.approx((20.0, 10.5, 1.5, 6.0, 2.0), abs=1e-6)
