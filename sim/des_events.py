"""What goes into and comes out of the discrete-event simulator (`sim.des`).

Inputs are scenario facts (a pipeline arrives, a device fails or slows down); outputs are
plain records of what happened, so metrics, JSON and plots need nothing from the simulator's
internals. All times are simulated seconds, except fields named `wall_*` (real seconds on the
machine that ran the simulation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from orchestrator.scheduling import TaskGraph


@dataclass(frozen=True, slots=True)
class Arrival:
    """A pipeline submitted at simulated time `at`."""

    at: float
    graph: TaskGraph
    name: str = ""


@dataclass(frozen=True, slots=True)
class Failure:
    """A crash at `at`. `device` None: a device chosen (seeded) among those running a task
    then, else among the live ones. `whole_agent`: every device of that device's agent dies
    (a node failure), not just the one device."""

    at: float
    device: str | None = None
    whole_agent: bool = True


@dataclass(frozen=True, slots=True)
class Slowdown:
    """At `at` the device's speed is multiplied by `factor` (0.5: half as fast); running
    tasks finish their remaining work at the new speed. `device` None: chosen as `Failure`."""

    at: float
    factor: float
    device: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"slowdown factor must be finite and > 0, got {self.factor}")


def poisson_arrivals(
    graphs: Sequence[TaskGraph], rate: float, *, seed: int, start: float = 0.0
) -> list[Arrival]:
    """`graphs` submitted in order with exponential gaps of mean 1/`rate` (a Poisson process)."""
    if not rate > 0:
        raise ValueError("rate must be > 0")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=len(graphs))
    times = start + np.cumsum(gaps) - gaps[0] if len(graphs) else gaps
    return [
        Arrival(float(t), g, f"p{k}") for k, (t, g) in enumerate(zip(times, graphs, strict=True))
    ]


def trace_arrivals(graphs: Sequence[TaskGraph], times: Sequence[float]) -> list[Arrival]:
    """`graphs[k]` submitted at `times[k]` (a recorded trace)."""
    if len(graphs) != len(times):
        raise ValueError("need one arrival time per graph")
    return [
        Arrival(float(t), g, f"p{k}") for k, (t, g) in enumerate(zip(times, graphs, strict=True))
    ]


@dataclass(frozen=True, slots=True)
class ExecRecord:
    """One execution attempt of a task: `killed` when its device died under it."""

    pipeline: int
    task_id: str
    device_id: str
    slot: int
    start: float
    finish: float
    killed: bool = False


@dataclass(slots=True)
class PipelineRecord:
    """One pipeline's life. `planned_finish` is its first plan's makespan (absolute time);
    `completed` is None when it never finished (unschedulable, or stuck at the end)."""

    index: int
    name: str
    tasks: int
    arrival: float
    planned_finish: float = math.nan
    first_start: float = math.nan
    completed: float | None = None
    replans: int = 0
    rejected: str = ""

    @property
    def response(self) -> float:
        """Arrival to last task finished."""
        return math.nan if self.completed is None else self.completed - self.arrival

    @property
    def makespan(self) -> float:
        """First task started to last task finished."""
        return math.nan if self.completed is None else self.completed - self.first_start


@dataclass(slots=True)
class FailureRecord:
    """One crash and its recovery.

    `recovered` is when every task that was running on the dead devices runs again elsewhere
    (or, when none was running, when the affected work was re-placed); `replaced` is when the
    re-plan was in effect (detection + re-planning time)."""

    at: float
    devices: tuple[str, ...]
    detection_s: float
    detected: float = math.nan
    replaced: float = math.nan
    recovered: float = math.nan
    interrupted: int = 0
    requeued: int = 0
    pipelines: int = 0
    wall_replan_s: list[float] = field(default_factory=list)

    @property
    def recovery_s(self) -> float:
        return self.recovered - self.at


@dataclass(frozen=True, slots=True)
class SlowdownRecord:
    at: float
    device: str
    factor: float
    running: int
