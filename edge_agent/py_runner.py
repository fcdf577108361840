"""The `python` executor: call a public function of an allowlisted module in a worker thread.

Only functions defined in an allowlisted module are callable, so a name the module merely
imports (say `os.system`) is out of reach. A thread cannot be killed: on timeout or cancel the
task is reported at once and its slot freed, while the function runs on to its end unseen.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from edge_agent import values
from edge_agent.allowlist import python_problem
from edge_agent.executors import ExecutionError, Output
from schemas.pipeline import MediaType, PythonRun


def to_bytes(value: object) -> bytes:
    """bytes as they are, str as UTF-8, anything else as compact JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ExecutionError(f"result of type {type(value).__name__} is not JSON-able") from exc


def load_entry(entry: str, modules: Sequence[str]) -> Callable[..., Any]:
    """Import the module and return the function, re-checking the allowlist first."""
    problem = python_problem(entry, modules)
    if problem is not None:
        raise ExecutionError(f"not allowlisted: {problem}")
    module_name, _, fn_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExecutionError(f"cannot import {module_name}: {exc}") from exc
    fn = getattr(module, fn_name, None)
    if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
        raise ExecutionError(f"{entry} is not a function defined in {module_name}")
    return fn


def _call(
    entry: str,
    modules: Sequence[str],
    kwargs: dict[str, Any],
    limit: int,
    declared: MediaType | None = None,
) -> tuple[bytes, MediaType]:
    fn = load_entry(entry, modules)
    try:
        value = fn(**kwargs)
    except TypeError as exc:
        raise ExecutionError(f"{entry}: {exc}") from exc
    try:
        data, kind = values.encode(value, declared)
    except values.BadValue as exc:
        raise ExecutionError(f"{entry} returned what cannot be its output: {exc}") from exc
    if len(data) > limit:
        raise ExecutionError(f"output of {len(data)} bytes exceeds the limit of {limit}")
    return data, kind


async def run_python(
    run: PythonRun,
    modules: Sequence[str],
    *,
    timeout_s: float,
    max_output_bytes: int,
    inputs: dict[str, Any] | None = None,
    declared: MediaType | None = None,
) -> Output:
    """The call, with its kwargs and its inputs (decoded) as keywords."""
    timeout = min(run.timeout_s, timeout_s)
    kwargs: dict[str, Any] = dict(run.kwargs)
    clash = sorted(set(kwargs) & set(inputs or {}))
    if clash:
        raise ExecutionError(f"{', '.join(clash)}: both a kwarg and an input")
    kwargs.update(inputs or {})
    call = asyncio.to_thread(_call, run.entry, tuple(modules), kwargs, max_output_bytes, declared)
    try:
        data, kind = await asyncio.wait_for(call, timeout)
    except TimeoutError:
        raise ExecutionError(f"timed out after {timeout:g} s") from None
    return Output(data, f"{run.entry.partition(':')[2]} -> {len(data)} B {kind}", kind)
