"""Refresh the predictor's shipped features file from the agent's built-in models.

    python -m tools.model_features [NAME=PATH.onnx ...] [--out FILE]

Run after tools/build_models.py (needs `onnx`). A build-time tool: it reads the agent's model
files (`edge_agent.executors.BUILTIN_MODELS`), which the predictor itself never imports.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from orchestrator.predictor.features import FEATURES_FILE, write_book


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tools.model_features`: refresh the shipped features file from the
    built-in models (run after tools/build_models.py)."""
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("models", nargs="*", help="extra NAME=PATH.onnx pairs")
    p.add_argument("--out", type=Path, default=FEATURES_FILE)
    args = p.parse_args(argv)
    from edge_agent.executors import BUILTIN_MODELS

    pairs = [(f.stem, f) for f in sorted(BUILTIN_MODELS.glob("*.onnx"))]
    pairs += [(s.split("=", 1)[0], Path(s.split("=", 1)[1])) for s in args.models]
    write_book(pairs, args.out)
    print(f"wrote {args.out} ({len(pairs)} models)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
