"""The `python` executor: call a public function of an allowlisted module in a fresh process.

The function gets its kwargs and its inputs, decoded (bytes, text, numpy arrays, a dict of
them, JSON data), as keywords; what it returns is the output, encoded by `edge_agent.values`
(bytes, an array as `.npy`, a dict of arrays as `.npz`, text, anything else as JSON).

The allowlist is checked here (as on admission) and the module imported in the process from
the agent's own `sys.path`; only functions defined in that module are callable, so a name it
merely imports (say `os.system`) is out of reach. The process (`bundle_runner.run_child`, as
shipped bundles use) is killed past the time limit or on cancel, runs under resource limits,
and a crash of it fails the task, not the agent. Each call pays for a fresh interpreter and
its imports (a few tenths of a second of CPU on a small host, more for heavy modules).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Unpack

from edge_agent.allowlist import python_problem
from edge_agent.bundle_runner import CallArgs, run_child
from edge_agent.executors import ExecutionError, Output
from schemas.pipeline import PythonRun


def agent_path() -> list[str]:
    """The agent's `sys.path`, absolute (the process runs in a directory of its own)."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]


async def run_python(run: PythonRun, modules: Sequence[str], **call: Unpack[CallArgs]) -> Output:
    """The call, with its kwargs and its inputs (decoded) as keywords, where `modules` allow
    its module."""
    if (problem := python_problem(run.entry, modules)) is not None:
        raise ExecutionError(f"not allowlisted: {problem}")
    return await run_child(run, {"path": agent_path()}, **call)
