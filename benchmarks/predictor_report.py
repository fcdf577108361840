"""Alias of `python -m orchestrator.predictor.report` (labels' repeatability, the shipped
predictor's accuracy on held-out models, right-fastest regret, scoring cost).

    python -m benchmarks.predictor_report [--split test|val]
"""

from __future__ import annotations

from orchestrator.predictor.report import main

if __name__ == "__main__":
    raise SystemExit(main())
