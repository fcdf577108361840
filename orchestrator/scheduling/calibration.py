"""How fast this process's list-scheduling loop is, measured once: the portfolio's admission.

The portfolio decides which candidates fit its time budget from estimates, never from the
clock during a call, so that one graph gets one plan. Estimates from fixed constants were
calibrated for the Python loop; the compiled loop runs HEFT 60-100x faster (and the Python
loop itself is several times faster than those constants), so at a 0.05 s budget large graphs
got PEFT or CPOP or nothing beyond HEFT while the whole call took a few milliseconds.

`loop_scale()` times HEFT on a fixed 300-task problem once per process (the first portfolio
call, before its clock starts; best of 7 runs after a warm one, in CPU time) and returns
measured / formula, rounded to a quarter power of two so that repeated calibrations on one
machine mostly agree despite timing noise (the estimate is then within 1.09x of the
measurement on that problem; whole powers of two left it up to 1.41x under, and calls over
their budget). Each candidate's
cost relative to HEFT depends on the loop (compiled: PEFT and CPOP are 15-37x HEFT, HEFT
variants ~1.5x; Python: ~2-3x and ~1.05x); those factors are constants measured offline
(`portfolio.Candidate`), one per loop, the largest seen at 50-200 tasks.
"""

from __future__ import annotations

import math
import time

from orchestrator.scheduling.cost import LinkCostModel
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.heft import heft_prepared
from orchestrator.scheduling.model import Cluster, Device, Task, TaskGraph

# Cost shape of one HEFT run, seconds before scaling: per task, per edge, per (task or edge)
# x device (the Python loop's constants of an earlier engine; `loop_scale` rescales them).
T_TASK = 50e-6
T_EDGE = 12e-6
T_CELL = 8e-9
#: ... plus a fixed cost per call (setting up the loop's arrays), which dominates small graphs:
#: without it a 10-task HEFT was estimated at a quarter of its measured time.
T_CALL = 1.5e-3
#: The calibration problem: tasks in layers of `_WIDTH`, three out-edges each, on 16 devices.
_TASKS = 300
_WIDTH = 20
_DEVICES = 16
_RUNS = 7

_scale: float | None = None


def formula(tasks: int, edges: int, devices: int) -> float:
    """Unscaled estimate of one HEFT run, seconds (`T_CALL`, `T_TASK`, `T_EDGE`, `T_CELL`)."""
    return T_CALL + T_TASK * tasks + T_EDGE * edges + T_CELL * (tasks + edges) * devices


def calibration_problem() -> Prepared:
    """A fixed layered DAG on a heterogeneous 4-site cluster (no randomness)."""
    tasks = [Task(f"t{i}", work=1.0 + (i * 7) % 5) for i in range(_TASKS)]
    edges: dict[tuple[str, str], float] = {}
    for i in range(_TASKS - _WIDTH):
        base = (i // _WIDTH + 1) * _WIDTH
        for k in (0, 3, 11):
            edges[(f"t{i}", f"t{base + (i + k) % _WIDTH}")] = 1e6 * (1 + (i + k) % 4)
    devices = [Device(f"d{j}", f"h{j}", f"s{j % 4}", speed=1.0 + j % 5) for j in range(_DEVICES)]
    return Prepared(TaskGraph(tasks, edges), Cluster(devices), LinkCostModel(), None, 0.0)


def measure() -> float:
    """Measured / formula for HEFT on the calibration problem, in this process (unrounded).

    Timed in this thread's CPU time, not wall time: on a host whose other processes compete
    for the cores, wall time would read the loop slower than it is and admit fewer candidates
    (on a loaded 2-core machine, twice as slow), so plans would depend on the neighbours."""
    prep = calibration_problem()
    heft_prepared(prep)  # warm: tables built, kernel loaded
    best = math.inf
    for _ in range(_RUNS):
        t0 = time.thread_time()
        heft_prepared(prep)
        best = min(best, time.thread_time() - t0)
    return best / formula(len(prep.todo), len(prep.graph.edges), len(prep.cluster))


#: The scale is rounded to a power of 2**(1/STEPS): repeated calibrations on one machine mostly
#: agree, and an estimate is within 2**(1/(2*STEPS)) (9 %) of the measurement it came from.
STEPS = 4


def loop_scale() -> float:
    """This process's scale for `formula`, rounded (`STEPS`), measured on first use and fixed
    from then on (`set_loop_scale` overrides it)."""
    global _scale
    if _scale is None:
        _scale = 2.0 ** (round(STEPS * math.log2(max(measure(), 1e-9))) / STEPS)
    return _scale


def set_loop_scale(scale: float | None) -> None:
    """Fix the scale (e.g. to reproduce another process's admissions); None: measure again on
    next use."""
    global _scale
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    _scale = scale
