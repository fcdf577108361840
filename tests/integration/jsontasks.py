"""Functions `python` tasks in tests call to pass JSON data from one task to the next, none of
them declaring an `output_type`. The task's process imports this module from the agent's (the
test run's) path: allowlist `tests.integration.jsontasks`."""

from __future__ import annotations

from typing import Any


def make(n: int = 3, pad: int = 0) -> dict[str, Any]:
    """A dict (sent as JSON), `pad` characters larger than it needs to be."""
    return {"n": n, "pad": "x" * pad}


def take(doc: Any) -> dict[str, Any]:
    """What the task was given: its type, and the `n` of a dict."""
    return {"type": type(doc).__name__, "n": doc.get("n") if isinstance(doc, dict) else None}
