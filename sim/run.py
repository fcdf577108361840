"""`mars sim run SCENARIO` / `python -m sim.run SCENARIO`: run a simulation scenario.

Runs every policy variant of the scenario on `--seeds` seeds (from `--seed` on), prints the
scenario's tables on stdout, each figure the mean and 95% confidence interval over the seeds
(progress on stderr), and writes `result.json`, `utilisation.png`, `completion_cdf.png` and
`gantt.png` under `--out` (default `out/sim/SCENARIO`); the PNGs only where matplotlib is
installed (the `sim` extra).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

NAMES = ("seed-table", "edge-cloud", "scale-10k", "failures")
"""The scenarios (`sim.scenarios.SCENARIOS`), listed here so building the CLI stays cheap."""

SEEDS, QUICK_SEEDS = 5, 3
"""Default number of seeds per run, full and `--quick`."""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("scenario", choices=NAMES, help="which scenario")
    ap.add_argument("--out", help="output directory (default: out/sim/SCENARIO)")
    ap.add_argument("--seed", type=int, default=1, help="first seed (then seed+1, ...)")
    ap.add_argument(
        "--seeds",
        type=int,
        help=f"how many seeds (default {SEEDS}, with --quick {QUICK_SEEDS})",
    )
    ap.add_argument("--quick", action="store_true", help="a small version, for smoke tests")
    ap.add_argument("--no-plots", action="store_true", help="JSON only (no matplotlib)")


def run(args: argparse.Namespace) -> int:
    from sim.plots import missing
    from sim.report import log
    from sim.scenarios import SCENARIOS

    out = Path(args.out) if args.out else Path("out") / "sim" / args.scenario
    plots = not args.no_plots
    if plots and (why := missing()) is not None:  # tables and JSON need no matplotlib
        log(f"{why}; writing the tables and result.json only (--no-plots asks for just those)")
        plots = False
    n = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else SEEDS)
    if n < 1:
        log("--seeds must be at least 1")
        return 2
    t0 = time.perf_counter()
    SCENARIOS[args.scenario](out, range(args.seed, args.seed + n), args.quick, plots)
    log(f"{args.scenario}: {time.perf_counter() - t0:.1f} s real in all")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.run", description=__doc__)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
