"""How long the orchestrator's periodic passes over its live pipelines hold its event loop.

    python -m benchmarks.watchdog_look [--pipelines 100,1000,5000] [--tasks 20]

Every `STALL_S / 2` (5 s) the watchdog looks at every live pipeline this replica holds (every
task of each: free to start and not started? started and long overdue?). Submissions and task
events that arrive meanwhile wait for the loop. Each row holds that many live pipelines of
`--tasks` tasks (a few done, a few running, the rest accepted; every other one with a task
stalled) in an orchestrator that was never started (no NATS: the look is pure CPU), and times
the look made in one pass (`Watchdog.check`, the reference: how it ran before) and in slices
(`Watchdog.look`, how `mars orchestrator` runs it now): the whole look, and the longest the
loop was held without a turn, seen by a task that counts the loop's turns meanwhile. The
same for the renewal of the pipelines' reservations (every `LEASE_S / 3`, 5 s), whose first
part finds every live pipeline's device keys: in one pass (the reference, written here as it
was) and as `Orchestrator.renew_all` does it now, in slices (its writes go to a recorder
here, the same keys both ways). Best of 3 runs each (the watchdog's warnings for the stalled
tasks are not logged).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from benchmarks.common import counts, progress, table
from orchestrator.infra import eventloop
from orchestrator.reservations.store import device_key_of
from orchestrator.scheduling import Placement
from orchestrator.service import Orchestrator
from orchestrator.state.pipelines import PipelineRun
from sim.fleet import synthetic_pipeline

NOW = 100.0  # past the stall time of every task free to start since 0


def live_run(k: int, tasks: int = 20) -> PipelineRun:
    """A running pipeline: a few tasks done, a few running, the rest accepted and not due
    yet; with `k` odd, its ninth task free to start since 0 and never started (stalled)."""
    spec = synthetic_pipeline(random.Random(k), f"p{k}", tasks=tasks, seconds=(1.0, 5.0))
    run = PipelineRun(f"p{k}", spec, 0.0, submitted_wall=1e9, owner="o")
    run.committed_at, run.state = 0.0, "running"
    target = spec.tasks[8].id if k % 2 else None
    done = {t.id for t in spec.tasks[:5]} | (set(spec.tasks[8].deps) if target else set())
    for i, t in enumerate(spec.tasks):
        start = 0.0 if t.id == target or t.id in done else NOW + i
        run.placements[t.id] = Placement(t.id, "a:cpu0", 0, start, start + 1.0)
        tr = run.tasks[t.id]
        tr.agent_id, tr.device_id, tr.token = "a", "cpu0", 1
        if t.id in done:
            tr.state, tr.finished_s = "succeeded", 0.0
        elif i < 8:
            tr.state, tr.started_s = "started", NOW - 1.0
        else:
            tr.state = "accepted"
    return run


def idle_orchestrator(
    runs: int, behind: Callable[[], bool] = lambda: False, tasks: int = 20
) -> tuple[Orchestrator, list[str]]:
    """An orchestrator that was never started holding `runs` live pipelines; the ids of the
    pipelines it sends commits again for are listed (the coroutines are not run)."""
    o = Orchestrator("nats://127.0.0.1:1")
    o.failover.may_act = lambda pid: True  # type: ignore[method-assign]
    o.mono = lambda: NOW  # type: ignore[method-assign]
    o.events_behind = behind  # type: ignore[method-assign]
    committed: list[str] = []

    def commit_all(
        run: PipelineRun, task_ids: set[str], *, unanswered: bool = False, look: bool = True
    ) -> Coroutine[Any, Any, None]:
        committed.append(run.pipeline_id)
        return asyncio.sleep(0)

    def spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        coro.close()  # commits (listed above), replays, re-runs: never run here
        return None  # type: ignore[return-value]

    o.commits.commit_all = commit_all  # type: ignore[method-assign]
    o.spawn = spawn  # type: ignore[method-assign]
    for k in range(runs):
        run = live_run(k, tasks)
        o.pipelines[run.pipeline_id] = run
    return o, committed


class Held(NamedTuple):
    whole_s: float
    #: The longest gap between two turns of the loop meanwhile.
    longest_s: float
    #: Turns the loop took meanwhile (counting the one that saw it end).
    turns: int


async def held(look: Callable[[], Coroutine[Any, Any, None]]) -> Held:
    """How long `look` took and how it shared the loop, seen by a task that takes a turn
    whenever it can."""
    gaps: list[float] = []
    looking = True

    async def ticker() -> None:
        last = time.perf_counter()
        while looking:
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    gaps.clear()
    t0 = time.perf_counter()
    await look()
    whole = time.perf_counter() - t0
    looking = False
    await tick
    return Held(whole, max(gaps, default=whole), len(gaps))


class Renewals:
    """A booking store that only records what it is asked to renew."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, set[str]]] = []

    async def renew(self, key: str, pipeline_ids: set[str], expires: float, now: float) -> int:
        self.calls.append((key, set(pipeline_ids)))
        return 1


async def renew_in_one_pass(o: Orchestrator) -> None:
    """The renewal as it was: every live pipeline's keys found in one pass, then written."""
    now = o.wall()
    by_key: dict[str, set[str]] = {}
    for run in list(o.pipelines.values()):
        if run.terminal:
            continue
        for d in run.devices():
            by_key.setdefault(device_key_of(d), set()).add(run.pipeline_id)
    for key, pids in by_key.items():
        await o.store.renew(key, pids, now + o.lease_s, now)


async def measure(runs: int, tasks: int) -> list[float]:
    """Best (look: one pass, its longest hold; in slices, its longest hold; then the same for
    the renewal)."""
    best = [float("inf")] * 8
    for _ in range(3):
        one, _ = idle_orchestrator(runs, tasks=tasks)
        sliced, _ = idle_orchestrator(runs, tasks=tasks)
        one.store, sliced.store = Renewals(), Renewals()  # type: ignore[assignment]

        async def one_pass(o: Orchestrator = one) -> None:
            o.watchdog.check()

        async def renew_before(o: Orchestrator = one) -> None:
            await renew_in_one_pass(o)

        gc.collect()
        gc.disable()
        try:
            got = [
                x
                for h in (
                    await held(one_pass),
                    await held(sliced.watchdog.look),
                    await held(renew_before),
                    await held(sliced.renew_all),
                )
                for x in (h.whole_s, h.longest_s)
            ]
        finally:
            gc.enable()
        if one.store.calls != sliced.store.calls:  # type: ignore[attr-defined]
            raise SystemExit("the two renewals renewed different pipelines")
        best = [min(x, y) for x, y in zip(best, got, strict=True)]
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pipelines", type=counts, default=[100, 1000, 5000])
    ap.add_argument("--tasks", type=int, default=20)
    args = ap.parse_args(argv)
    if args.tasks < 9:
        ap.error("--tasks must be >= 9 (the ninth task is the one that stalls)")
    # each stalled task is reported once, as a warning: not what is timed here
    quiet = logging.getLogger("mars.watchdog")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    rows: list[list[object]] = []
    renewal: list[list[object]] = []
    try:
        for n in args.pipelines:
            progress(f"{n} live pipelines")
            one, one_held, whole, most, r_one, r_held, r_whole, r_most = eventloop.run(
                measure(n, args.tasks)
            )
            rows.append([n, one * 1e3, one_held * 1e3, whole * 1e3, most * 1e3, one_held / most])
            renewal.append([n, r_one * 1e3, r_held * 1e3, r_whole * 1e3, r_most * 1e3,
                            r_held / r_most])  # fmt: skip
    finally:
        quiet.setLevel(level)
    header = [
        "live pipelines", "one pass ms", "loop held ms", "in slices ms", "loop held ms",
        "held: one pass / slices",
    ]  # fmt: skip
    print("the watchdog's look\n" + table(rows, header))
    print("\nthe reservations' renewal\n" + table(renewal, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
