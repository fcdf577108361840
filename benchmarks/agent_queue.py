"""An agent's CPU per task as its queue deepens: the ready queue against a scan of every job.

    python -m benchmarks.agent_queue [--depths 10,100,1000,5000] [--tasks 1000]

An agent looks for jobs it may start after every input that arrives, every commit and every
task that ends. It keeps, per device, the jobs that became ready (`AgentCore.take_ready`);
`scan`, kept here as the reference, looks at every job it holds instead. Each depth
holds that many committed jobs waiting for an input; then, `--tasks` times, one job's input
arrives, it starts, it ends, and a new job is offered and committed in its place, so the
queue stays that deep. Both ways run the same steps on their own agent core (the state
machine, no network) and must start the same jobs in the same order; the figure is the best
of 3 runs, in microseconds per task (its five events together; filling the queue not timed).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

from benchmarks.common import counts, progress, table
from edge_agent.core import AgentCore, Job, Key
from schemas import CommitCommand, DataTransfer, DeviceSpec, InputRef, TaskOffer, TaskSpec

SHA = "0" * 64
TASK = TaskSpec.model_validate({"id": "t", "run": {"kind": "synthetic"}})


def scan(core: AgentCore) -> list[Job]:
    """The way before: every job looked at, the ready ones in plan order, up to the free slots."""
    ready = sorted(
        (j for j in core.jobs.values() if j.ready()),
        key=lambda j: (j.offer.order, j.offer.pipeline_id, j.offer.task.id),
    )
    started: list[Job] = []
    for job in ready:
        dev = job.offer.device_id
        if core.running[dev] < core.devices[dev].slots:
            core.running[dev] += 1
            job.state = "running"
            started.append(job)
    return started


def offer(i: int) -> TaskOffer:
    return TaskOffer(
        pipeline_id=f"p{i // 20}",
        agent_id="a1",
        incarnation="inc1",
        device_id="cpu0",
        token=1,
        order=i,
        task=TASK.model_copy(update={"id": f"t{i}"}),
        inputs=[InputRef(task_id="src", agent_id="a2")],
    )


def workload(depth: int, tasks: int) -> tuple[list[TaskOffer], list[DataTransfer]]:
    """Offers for the jobs queued at the start and those that follow, and each one's input
    (arriving in a shuffled order: not always the job first in line)."""
    offers = [offer(i) for i in range(depth + tasks)]
    arrive = [(i * 7919) % depth for i in range(tasks)]  # a spread of queue positions
    queue = list(range(depth))
    inputs = []
    for k, pos in enumerate(arrive):
        o = offers[queue.pop(pos % len(queue))]
        queue.append(depth + k)
        inputs.append(
            DataTransfer(
                pipeline_id=o.pipeline_id,
                producer="src",
                consumer=o.task.id,
                token=1,
                data=b"x",
                sha256=SHA,
            )
        )
    return offers, inputs


def run(
    depth: int,
    offers: list[TaskOffer],
    inputs: list[DataTransfer],
    take: Callable[[AgentCore], list[Job]],
) -> tuple[list[Key], float]:
    """The jobs started, in order, and the best time of 3 runs of the events (the queue
    filled before each, untimed; the collector paused while timing, as `timeit` does)."""
    best = float("inf")
    started: list[Key] = []
    for _ in range(3):
        core = AgentCore(
            "a1", "inc1", [DeviceSpec(device_id="cpu0", kind="cpu", slots=1)], ["synthetic"]
        )
        for o in offers[:depth]:
            core.admit(o)
            core.commit(CommitCommand(pipeline_id=o.pipeline_id, task_ids=[o.task.id]))
        take(core)
        started = []
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            for k, transfer in enumerate(inputs):
                core.deliver(transfer)  # an input arrives
                for job in take(core):
                    started.append(job.key)
                    core.finish(job.key, ok=True)  # it ran
                take(core)
                new = offers[depth + k]  # and the next is offered and committed
                core.admit(new)
                core.commit(CommitCommand(pipeline_id=new.pipeline_id, task_ids=[new.task.id]))
                take(core)
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    return started, best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--depths", type=counts, default=[10, 100, 1000, 5000])
    ap.add_argument("--tasks", type=int, default=1000)
    args = ap.parse_args(argv)
    if args.tasks < 1:
        ap.error("--tasks must be >= 1")
    depths: list[int] = args.depths
    rows = []
    for depth in depths:
        progress(f"queue depth {depth}")
        offers, inputs = workload(depth, args.tasks)
        want, t_scan = run(depth, offers, inputs, scan)
        got, t_queue = run(depth, offers, inputs, AgentCore.take_ready)
        if got != want or len(got) != args.tasks:
            raise SystemExit(f"depth {depth}: the two ways started different jobs")
        per = 1e6 / args.tasks
        rows.append([depth, t_scan * per, t_queue * per, t_scan / t_queue])
    print(table(rows, ["jobs queued", "scan us/task", "ready queue us/task", "scan / queue"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
