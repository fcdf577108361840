"""CPU cost of one pipeline record write, built as models and as plain fields.

    python -m benchmarks.record_write [--tasks 20] [--repeat 2000]

The orchestrator writes a pipeline's record (`MARS_RUNS`, what a replica adopting it resumes
from) after its placement, at most once per progress period while it runs, and at its end.
This times building and encoding one record of a `--tasks`-task pipeline, every task placed
and finished, both ways: as the validated model (`PipelineRecord.model_validate` of
`record_fields`, then `encode`) and as the plain fields the orchestrator writes
(`record_fields` + `encode_trusted`: the same bytes, checked before timing).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

from benchmarks.common import table, timed
from orchestrator.placement.placer import planned_view
from orchestrator.reliability.ownership import record_fields
from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun
from schemas.codec import encode, encode_trusted
from schemas.failover import PipelineRecord
from sim.fleet import synthetic_pipeline


def finished_run(tasks: int) -> PipelineRun:
    spec = synthetic_pipeline(random.Random(1), "rec", tasks=tasks, seconds=(0.001, 0.005))
    run = PipelineRun("p" * 32, spec, 0.0, submitted_wall=1e9, owner="orch-0123456789")
    for i, t in enumerate(spec.tasks):
        agent = f"agent-{i % 7:03d}"
        run.placements[t.id] = Placement(t.id, f"{agent}:cpu0", 0, 0.002 * i, 0.002 * i + 0.004)
        tr = run.tasks[t.id]
        tr.agent_id, tr.device_id, tr.token, tr.state = agent, "cpu0", 1000 + i, "succeeded"
        tr.started_s, tr.finished_s = 0.002 * i, 0.002 * i + 0.003
        tr.duration_s, tr.predicted_s = 0.003, 0.004
    run.plan = planned_view(run.placements)
    run.algorithm, run.state = "heft", "succeeded"
    run.note("round 0: placed every task")
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.repeat < 1:
        ap.error("counts must be >= 1")
    run, repeat = finished_run(args.tasks), int(args.repeat)

    def via_models() -> bytes:
        rec = record_fields(run, epoch=1, events_seq=40, adoptions=0, mono=5.0, wall=1e9 + 5.0)
        return encode(PipelineRecord.model_validate(rec))

    def via_fields() -> bytes:
        rec = record_fields(run, epoch=1, events_seq=40, adoptions=0, mono=5.0, wall=1e9 + 5.0)
        return encode_trusted(rec)

    fields = via_fields()
    if via_models() != fields:
        raise SystemExit("the two builds differ: record_fields no longer matches the models")

    def per_call(fn: Callable[[], bytes]) -> float:
        def batch() -> int:
            for _ in range(repeat):
                fn()
            return 0

        return timed(batch, repeat=5)[1] / repeat

    a, b = per_call(via_models), per_call(via_fields)
    print(f"pipeline record of {args.tasks} tasks: {len(fields)} bytes (the same both ways)")
    print(table(
        [["model: validate + encode", a * 1e6], ["fields: record_fields + encode_trusted",
                                                   b * 1e6]],
        ["build and encode", "us per record"],
    ))  # fmt: skip
    print(f"fields / model: {b / a:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
