"""Execution-time estimates per (task, device)."""

from orchestrator.predictor.prior import estimate_seconds

__all__ = ["estimate_seconds"]
