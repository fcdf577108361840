"""CPU cost of the pipeline state machine on the event path, against the rules it applies.

    python -m benchmarks.lifecycle_step [--tasks 20] [--pipelines 300]

Every task event the owning replica hears goes through `lifecycle.step(run, Heard(event),
now)`, which applies it with `PipelineRun.apply` and returns the effects for the shell. This
feeds `--pipelines` fresh runs of a `--tasks`-task chain their `started` and `succeeded`
events both ways, and prints the best of five passes per event and per pipeline (less the time
to build the runs, measured alone): what the machine adds to the bare rules (the reference,
measured in the same run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from benchmarks.common import table, timed
from orchestrator.state import lifecycle
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec, TaskEvent


def chain(tasks: int) -> PipelineSpec:
    return PipelineSpec.model_validate({"name": "chain", "tasks": [
        {"id": f"t{i}", "run": {"kind": "synthetic"}, "deps": [f"t{i - 1}"] if i else []}
        for i in range(tasks)
    ]})  # fmt: skip


def running(spec: PipelineSpec) -> PipelineRun:
    run = PipelineRun("p1", spec, 0.0)
    for i, tr in enumerate(run.tasks.values()):
        tr.agent_id, tr.device_id, tr.token, tr.state = "ag", "cpu0", i + 1, "accepted"
    run.state, run.committed_at = "running", 0.0
    return run


def events(spec: PipelineSpec) -> list[TaskEvent]:
    return [
        TaskEvent.model_validate(
            {
                "event_id": f"{t.id}-{state}",
                "pipeline_id": "p1",
                "task_id": t.id,
                "agent_id": "ag",
                "incarnation": "i",
                "device_id": "cpu0",
                "token": i + 1,
                "state": state,
                "duration_s": 0.01,
            }
        )
        for i, t in enumerate(spec.tasks)
        for state in ("started", "succeeded")
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--pipelines", type=int, default=300)
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.pipelines < 1:
        ap.error("counts must be >= 1")
    spec, pipelines = chain(args.tasks), int(args.pipelines)
    evs = events(spec)

    def per_event(feed: Callable[[PipelineRun, TaskEvent], object] | None) -> float:
        """Seconds per event, building the fresh runs included (`feed` None: only that)."""

        def batch() -> str:
            runs = [running(spec) for _ in range(pipelines)]
            if feed is not None:
                for run in runs:
                    for ev in evs:
                        feed(run, ev)
            return runs[-1].state

        state, best = timed(batch, repeat=5)
        if feed is not None and state != "succeeded":
            raise SystemExit(f"the runs ended {state}, not succeeded: the events are wrong")
        return best / (pipelines * len(evs))

    building = per_event(None)
    bare = per_event(lambda run, ev: run.apply(ev, 1.0)) - building
    machine = per_event(lambda run, ev: lifecycle.step(run, lifecycle.Heard(ev), 1.0)) - building
    n = len(evs)
    print(f"{args.pipelines} runs of a {args.tasks}-task chain, {n} events each (best of 5)")
    print(table(
        [["PipelineRun.apply (reference)", bare * 1e6, bare * n * 1e3],
         ["lifecycle.step", machine * 1e6, machine * n * 1e3],
         ["added by the machine", (machine - bare) * 1e6, (machine - bare) * n * 1e3]],
        ["per event", "us", "ms per pipeline"],
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
