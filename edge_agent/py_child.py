"""One call of a `python` task's function, in a fresh process of its own (`bundle_runner`).

Run as `python -I py_child.py ENTRY`. Reads from stdin two pickles the agent wrote (its own
data, so safe to unpickle): first how to run (`limits`: resource name -> (soft, hard), applied
before anything else; `bundle`: a shipped bundle's path, or `path`: the agent's `sys.path` for
an allowlisted module; `max_output_bytes`), then the call (`kwargs`, `declared`). Writes to
stdout the output's media type, a newline and its bytes, encoded by the agent's own rules
(`edge_agent.values`), or `error`, a newline and why the call could not be made or its result
not be the output (exit status 2). What the function prints goes to stderr; an exception it
raises is a traceback there and exit status 1.

A bundle goes first on the path, after the agent's `edge_agent.values` is loaded, and the
entry's module must be the bundle's. An allowlisted module is imported as the agent would.
Either way the entry must be a public function defined in its module (not one it imports).
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import resource
import signal
import sys
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

ERROR = b"error"
PR_SET_PDEATHSIG = 1
#: Longest reason written (the agent reads a few KiB past the output limit).
MESSAGE = 2000


def _refuse(out: BinaryIO, message: str) -> NoReturn:
    out.write(ERROR + b"\n" + message[:MESSAGE].encode("utf-8", "replace"))
    out.flush()
    sys.exit(2)


def _limit(limits: dict[str, tuple[int, int]]) -> None:
    """Lower each limit (soft and hard: the function cannot raise them again)."""
    for name, (soft, hard) in limits.items():
        res = getattr(resource, name)
        _, cur = resource.getrlimit(res)
        if cur != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur), min(hard, cur)
        resource.setrlimit(res, (soft, hard))


def _die_with_parent() -> None:
    """Killed when the agent dies (Linux): an agent killed outright leaves no call running
    unseen until its CPU limit. Elsewhere, or refused, the CPU limit is the bound."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main() -> None:
    _die_with_parent()
    entry = sys.argv[1]
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the function's prints (C extensions' too) go to stderr
    sys.stdout = sys.stderr
    how = pickle.load(sys.stdin.buffer)
    _limit(how["limits"])
    try:
        _call(entry, how, out)
    except MemoryError as exc:
        memory = how["limits"].get("RLIMIT_DATA")
        limit = f" (its memory limit is {memory[0] >> 20} MiB)" if memory else ""
        _refuse(out, f"{entry} ran out of memory{limit}: MemoryError: {exc}")


def _call(entry: str, how: dict[str, Any], out: BinaryIO) -> None:
    bundle = how.get("bundle")
    if isinstance(bundle, str):  # the call (numpy arrays too) with the agent's own modules
        job = pickle.load(sys.stdin.buffer)
        home = str(Path(__file__).resolve().parents[1])
        sys.path.insert(0, home)
        from edge_agent import values

        sys.path.remove(home)
        sys.path.insert(0, bundle)
    else:
        sys.path[:] = how["path"]
        job = pickle.load(sys.stdin.buffer)
        from edge_agent import values
    module_name, _, fn_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _refuse(out, f"cannot import {module_name}{' from the bundle' if bundle else ''}: {exc}")
    origin = getattr(module, "__file__", None) or ""
    if isinstance(bundle, str) and not origin.startswith(bundle + os.sep):
        _refuse(out, f"module {module_name} is not the bundle's (it is {origin or 'built in'})")
    fn = getattr(module, fn_name, None)
    if fn_name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module_name:
        _refuse(out, f"{entry} is not a public function defined in {module_name}")
    try:
        value = fn(**job["kwargs"])
    except TypeError as exc:
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
            _refuse(out, f"{entry}: {exc}")  # the call itself: the wrong keywords
        raise
    try:
        data, kind = values.encode(value, job["declared"])
    except values.BadValue as exc:
        _refuse(out, f"{entry} returned what cannot be its output: {exc}")
    if len(data) > how["max_output_bytes"]:
        _refuse(out, f"output of {len(data)} bytes exceeds the limit of {how['max_output_bytes']}")
    out.write(kind.encode() + b"\n" + data)
    out.flush()


if __name__ == "__main__":
    main()
