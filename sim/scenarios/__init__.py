"""Named simulation scenarios for `mars sim run SCENARIO` (defined in code).

Each is `run(out, seeds, quick, plots) -> dict`: it simulates its policy variants on each
seed, prints tables (mean and 95% interval over the seeds) and writes `result.json` plus PNG
plots under `out`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sim.scenarios import edge_cloud, failures, scale, seed_table

Runner = Callable[[Path, Sequence[int], bool, bool], dict[str, Any]]

SCENARIOS: dict[str, Runner] = {
    "seed-table": seed_table.run,
    "edge-cloud": edge_cloud.run,
    "scale-10k": scale.run,
    "failures": failures.run,
}

__all__ = ["SCENARIOS", "Runner"]
