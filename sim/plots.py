"""PNG plots of a scenario run: utilisation over time, response-time CDF, one Gantt chart.

matplotlib is an optional extra (`pip install -e ".[sim]"`), imported here lazily with the
Agg backend, so the rest of `sim` and the scheduler core never need it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: What to install for the plots.
NEED = 'PNG plots need matplotlib: pip install "mars-orchestrator[sim]" (a checkout: -e ".[sim]")'


def missing() -> str | None:
    """Why plots cannot be drawn here (matplotlib is not installed), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return NEED
    return None


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:  # `sim.run` looks first (`missing`)
        raise RuntimeError(NEED) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def utilisation_png(path: Path, runs: Mapping[str, Mapping[str, Any]], title: str) -> None:
    """One line per policy: utilisation (%) per time bin."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, s in runs.items():
        edges, values = s["utilisation"]["edges"], s["utilisation"]["values"]
        mids = [(a + b) / 2 for a, b in itertools.pairwise(edges)]
        ax.plot(mids, [100 * v for v in values], label=name, linewidth=1.2)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("utilisation (% of live slot-seconds)")
    ax.set_title(title)
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cdf_png(path: Path, runs: Mapping[str, Mapping[str, Any]], title: str) -> None:
    """Empirical CDF of pipeline response times (arrival to completion), per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, s in runs.items():
        xs: Sequence[float] = s["response_s_sorted"]
        if xs:
            ys = [(k + 1) / len(xs) for k in range(len(xs))]
            ax.step(xs, ys, where="post", label=name, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("pipeline response time (s, log scale)")
    ax.set_ylabel("fraction of pipelines")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def gantt_png(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> None:
    """One bar per executed attempt of one pipeline, one lane per device slot; killed
    attempts hatched."""
    plt = _pyplot()
    lanes = sorted({(r["device"], r["slot"]) for r in rows})
    lane = {key: k for k, key in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.3 * len(lanes) + 1.2)))
    for r in rows:
        y = lane[(r["device"], r["slot"])]
        width = max(r["finish"] - r["start"], 1e-9)
        ax.barh(
            y,
            width,
            left=r["start"],
            height=0.7,
            color="tab:red" if r["killed"] else "tab:blue",
            hatch="//" if r["killed"] else None,
            edgecolor="black",
            linewidth=0.4,
        )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{d}/{s}" for d, s in lanes], fontsize=7)
    ax.set_xlabel("simulated time (s)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
