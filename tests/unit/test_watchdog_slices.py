"""The watchdog's look over many live pipelines gives the event loop turns as it goes, and
judges every pipeline as one pass would. No NATS: an orchestrator that was never started,
its live pipelines made by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from benchmarks.watchdog_look import NOW, held, idle_orchestrator
from orchestrator.reliability import watchdog
from orchestrator.state.pipelines import PipelineRun
from tests.unit.test_job_ask import Recorder


async def test_a_look_over_many_pipelines_gives_the_loop_turns() -> None:
    o, _ = idle_orchestrator(300)  # 6,000 tasks
    assert (await held(o.watchdog.look)).turns >= 300 * 20 // watchdog.SLICE_TASKS


async def test_a_look_in_slices_judges_as_one_pass_does() -> None:
    sliced, sent_sliced = idle_orchestrator(300)
    whole, sent_whole = idle_orchestrator(300)
    await sliced.watchdog.look()
    whole.watchdog.check()
    assert sent_sliced == sent_whole == [f"p{k}" for k in range(300) if k % 2]
    assert sliced.watchdog._reported == whole.watchdog._reported
    assert {r[3] for r in whole.watchdog._reported} == {"stalled"}


async def test_a_pipeline_that_ends_during_a_look_is_not_judged() -> None:
    o, sent = idle_orchestrator(300)
    last = o.pipelines["p299"]

    async def end_it() -> None:
        last.finish("cancelled", "by its submitter", NOW)

    ender = asyncio.create_task(end_it())  # runs at the look's first pause
    await o.watchdog.look()
    await ender
    assert "p297" in sent and "p299" not in sent


async def test_falling_behind_during_a_look_leaves_the_rest_for_the_next() -> None:
    calls = 0

    def behind() -> bool:
        nonlocal calls
        calls += 1
        return calls > 1  # caught up at the start, behind at the first pause

    o, sent = idle_orchestrator(300, behind)
    await o.watchdog.look()
    per_slice = watchdog.SLICE_TASKS // 20
    assert 0 < len(sent) <= per_slice and o.watchdog.skipped == 1


def test_the_look_benchmark_reports_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.watchdog_look import main

    assert main(["--pipelines", "5,120", "--tasks", "20"]) == 0
    out = capsys.readouterr().out
    assert "the watchdog's look" in out and "the reservations' renewal" in out
    firsts = [line.split()[0] for line in out.splitlines() if line[:1].isspace()]
    assert firsts == ["5", "120", "5", "120"]  # a row per count in each table
    with pytest.raises(SystemExit):
        main(["--tasks", "3"])  # too few for its pipelines' shape


async def test_what_a_look_cut_short_counted_stands_at_the_next_look() -> None:
    """A task stalled look after look is handed to recovery once, at its third look: the
    looks counted by a look that fell behind half-way are not counted again."""
    behind_now = False
    calls = 0

    def behind() -> bool:
        nonlocal calls
        calls += 1
        return behind_now and calls > 1

    o, _ = idle_orchestrator(300, behind)
    behind_now = True
    await o.watchdog.look()  # cut short after its first slice
    counted = dict(o.watchdog._stalled_looks)
    first = {pid for pid, *_ in counted}
    assert counted and set(counted.values()) == {1} and "p299" not in first
    behind_now = False
    await o.watchdog.look()
    after = o.watchdog._stalled_looks
    assert all(after[k] == 2 for k in counted)
    assert {n for (pid, *_), n in after.items() if pid not in first} == {1}


async def test_one_look_asks_agents_about_at_most_max_asks_overdue_tasks() -> None:
    """Under overload many started tasks look overdue at once: a look asks their agents
    about MAX_ASKS of them at most (each query is a request); the others wait for a later
    look. The queries go out on a stand-in connection that answers each `held`."""
    o, _ = idle_orchestrator(100)
    for run in list(o.pipelines.values()):  # (a stalled task's agent is asked too: not here)
        if run.stalled(NOW, o.watchdog.stall_s):
            del o.pipelines[run.pipeline_id]
    overdue = 0
    for run in o.pipelines.values():
        for tr in run.tasks.values():
            if tr.state == "started":
                tr.started_s = NOW - 1e4  # far past any prediction
                overdue += 1
    assert overdue > watchdog.MAX_ASKS
    nc = Recorder()
    o.nc = nc  # type: ignore[assignment]
    spawned: list[asyncio.Task[Any]] = []

    def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        spawned.append(asyncio.ensure_future(coro))  # replays and queries: run
        return spawned[-1]

    async def read_again(run: PipelineRun) -> int:
        return 0  # the events read again hold nothing new

    o.spawn = spawn  # type: ignore[method-assign]
    o.failover.replay = read_again  # type: ignore[method-assign]
    for _ in range(watchdog.STARVED_AFTER_LOOKS):
        o.watchdog.check()  # overdue, events read again: not asked yet
    await asyncio.gather(*spawned)
    assert nc.asked == [] and o.watchdog.asking == 0
    o.watchdog.check()
    assert o.watchdog.asking == watchdog.MAX_ASKS  # none answered yet
    await asyncio.gather(*spawned)
    assert len({(q.pipeline_id, q.task_id) for _, q in nc.asked}) == watchdog.MAX_ASKS
    assert len(nc.asked) == watchdog.MAX_ASKS == o.watchdog.job_answers["held"]
    assert o.watchdog.asking == 0  # all answered
