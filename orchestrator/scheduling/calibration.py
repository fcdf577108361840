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
their budget). Clusters too large for the dense loops (`is_wide`) take a numpy step per task
that costs several times more per task; they get a scale of their own (`wide_scale`, HEFT on
100 tasks x 300 devices, measured the first time a process plans on such a cluster): with one
scale, 1,000 tasks on 1,000 devices was estimated at 1.3 ms, ran 49 ms, and a 0.05 s portfolio
call took 0.55 s. Each candidate's cost relative to HEFT depends on the loop (compiled: PEFT
and CPOP are 15-37x HEFT, HEFT variants ~1.5x; Python: ~2-3x and ~1.05x); those factors are
constants measured offline (`portfolio.Candidate`), one per loop, the largest seen at 50-200
tasks.
"""

from __future__ import annotations

import math
import time

from orchestrator.scheduling import compiled
from orchestrator.scheduling.cost import LinkCostModel
from orchestrator.scheduling.engine import Prepared
from orchestrator.scheduling.heft import heft_prepared
from orchestrator.scheduling.model import Cluster, Device, Task, TaskGraph
from orchestrator.scheduling.transfer import DENSE_MAX, LISTS_MAX

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
#: The wide calibration problem: as many tasks, more devices than the dense loops take.
_WIDE_TASKS = 100
_WIDE_DEVICES = 300
#: On the wide path the cost per task grows with the task count (more bookings to search
#: past): (tasks / WIDE_FROM) ** WIDE_GROWTH, fitted on 30-1,000 tasks x 300-10,000 devices.
WIDE_FROM = 100
WIDE_GROWTH = 0.25

_scale: float | None = None
_wide: float | None = None


def formula(tasks: int, edges: int, devices: int) -> float:
    """Unscaled estimate of one HEFT run, seconds (`T_CALL`, `T_TASK`, `T_EDGE`, `T_CELL`)."""
    return T_CALL + T_TASK * tasks + T_EDGE * edges + T_CELL * (tasks + edges) * devices


def wide_formula(tasks: int, edges: int, devices: int) -> float:
    """`formula` for the wide path (`is_wide`), with its growth in the task count."""
    return formula(tasks, edges, devices) * float(max(1.0, tasks / WIDE_FROM) ** WIDE_GROWTH)


def is_wide(tasks: int, devices: int, slots: int) -> bool:
    """Whether HEFT on this many tasks, devices and slots takes the general (numpy per task)
    path rather than a dense loop: the compiled one up to DENSE_MAX devices and its cell
    limit, the Python lists one up to LISTS_MAX. Its cost per task is several times higher."""
    if devices <= LISTS_MAX:
        return False
    return not (compiled.runner() is not None and devices <= DENSE_MAX and
                compiled.fits(tasks, slots))  # fmt: skip


def calibration_problem(tasks: int = _TASKS, devices: int = _DEVICES) -> Prepared:
    """A fixed layered DAG on a heterogeneous 4-site cluster (no randomness)."""
    work = [Task(f"t{i}", work=1.0 + (i * 7) % 5) for i in range(tasks)]
    edges: dict[tuple[str, str], float] = {}
    for i in range(tasks - _WIDTH):
        base = (i // _WIDTH + 1) * _WIDTH
        for k in (0, 3, 11):
            edges[(f"t{i}", f"t{base + (i + k) % _WIDTH}")] = 1e6 * (1 + (i + k) % 4)
    devs = [Device(f"d{j}", f"h{j}", f"s{j % 4}", speed=1.0 + j % 5) for j in range(devices)]
    return Prepared(TaskGraph(work, edges), Cluster(devs), LinkCostModel(), None, 0.0)


def _best_time(prep: Prepared) -> float:
    """HEFT's least CPU time on `prep` over `_RUNS` runs after a warm one.

    This thread's CPU time, not wall time: on a host whose other processes compete for the
    cores, wall time would read the loop slower than it is and admit fewer candidates (on a
    loaded 2-core machine, twice as slow), so plans would depend on the neighbours."""
    heft_prepared(prep)  # warm: tables built, kernel loaded
    best = math.inf
    for _ in range(_RUNS):
        t0 = time.thread_time()
        heft_prepared(prep)
        best = min(best, time.thread_time() - t0)
    return best


def measure() -> float:
    """Measured / formula for HEFT on the calibration problem, in this process (unrounded)."""
    prep = calibration_problem()
    return _best_time(prep) / formula(len(prep.todo), len(prep.graph.edges), len(prep.cluster))


def measure_wide() -> float:
    """Measured / wide_formula for HEFT on the wide calibration problem (unrounded)."""
    prep = calibration_problem(_WIDE_TASKS, _WIDE_DEVICES)
    n, e, m = len(prep.todo), len(prep.graph.edges), len(prep.cluster)
    return _best_time(prep) / wide_formula(n, e, m)


def _rounded(measured: float) -> float:
    return float(2.0 ** (round(STEPS * math.log2(max(measured, 1e-9))) / STEPS))


#: The scale is rounded to a power of 2**(1/STEPS): repeated calibrations on one machine mostly
#: agree, and an estimate is within 2**(1/(2*STEPS)) (9 %) of the measurement it came from.
STEPS = 4


def loop_scale() -> float:
    """This process's scale for `formula`, rounded (`STEPS`), measured on first use and fixed
    from then on (`set_loop_scale` overrides it)."""
    global _scale
    if _scale is None:
        _scale = _rounded(measure())
    return _scale


def wide_scale() -> float:
    """The scale for `wide_formula`, measured on first use like `loop_scale` (~25 ms on a
    2-core VM; only processes planning on more than LISTS_MAX devices ever ask)."""
    global _wide
    if _wide is None:
        _wide = _rounded(measure_wide())
    return _wide


def estimate(tasks: int, edges: int, devices: int, slots: int) -> float:
    """Estimated seconds of one HEFT run of this size on this process's loops."""
    if is_wide(tasks, devices, slots):
        return wide_formula(tasks, edges, devices) * wide_scale()
    return formula(tasks, edges, devices) * loop_scale()


def set_loop_scale(scale: float | None, wide: float | None = None) -> None:
    """Fix the scales (e.g. to reproduce another process's admissions); None: measure that
    one again on next use."""
    global _scale, _wide
    for v in (scale, wide):
        if v is not None and not v > 0:
            raise ValueError(f"scale must be > 0, got {v}")
    _scale, _wide = scale, wide
