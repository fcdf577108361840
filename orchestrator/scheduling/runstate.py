"""What the fast earliest-finish loops read and write of a list-scheduling run, as protocols.

`engine.ListScheduler` (over an `engine.Prepared` request) hands itself to `smallrun.run_small`
or `compiled.run_compiled`; those loops see it through `RunState`, so they need not import the
engine that calls them. Read-only properties here: the engine's plain attributes satisfy them,
and the lists and arrays behind them are still written in place by the loops.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from orchestrator.scheduling.model import Cluster, TaskGraph
from orchestrator.scheduling.plan import Placement
from orchestrator.scheduling.timeline import ClusterSlots


class PreparedRequest(Protocol):
    """A checked request and its cost arrays (`engine.Prepared`): `w` is tasks x devices
    compute time (inf where a task may not run), `todo` the indices of the tasks to place."""

    @property
    def graph(self) -> TaskGraph: ...
    @property
    def cluster(self) -> Cluster: ...
    @property
    def now(self) -> float: ...
    @property
    def w(self) -> NDArray[np.float64]: ...
    @property
    def todo(self) -> list[int]: ...
    @property
    def fixed_idx(self) -> list[int]: ...
    @property
    def is_fixed(self) -> list[bool]: ...
    @property
    def topo_pos(self) -> list[int]: ...


class RunState(Protocol):
    """One list-scheduling run's state (`engine.ListScheduler`), used up by the loop."""

    @property
    def prep(self) -> PreparedRequest: ...
    @property
    def insertion(self) -> bool: ...
    @property
    def slots(self) -> ClusterSlots: ...
    @property
    def finish(self) -> list[float]: ...
    @property
    def where(self) -> list[int]: ...
    @property
    def has_zero(self) -> list[bool]: ...
    @property
    def placements(self) -> dict[str, Placement]: ...
