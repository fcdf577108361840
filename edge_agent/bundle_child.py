"""One call of a shipped Python bundle's function, in a process of its own (`bundle_runner`).

Run as `python -I bundle_child.py BUNDLE ENTRY`. Reads from stdin a pickle the agent wrote
(`{"kwargs": ..., "declared": ...}`: the agent's own data, so safe to unpickle); writes to
stdout the output's media type, a newline and its bytes, encoded by the agent's own rules
(`edge_agent.values`). What the function prints goes to stderr. Exits 2, with the reason on
stderr, when the entry cannot be called; 1 when the function raised.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
from pathlib import Path
from typing import NoReturn


def _fail(message: str) -> NoReturn:
    print(message, file=sys.stderr, flush=True)
    sys.exit(2)


def main() -> None:
    bundle, entry = sys.argv[1], sys.argv[2]
    job = pickle.load(sys.stdin.buffer)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the function's prints (C extensions' too) go to stderr
    sys.stdout = sys.stderr
    home = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, home)
    from edge_agent import values  # before the bundle is on the path: the agent's own

    sys.path.remove(home)
    sys.path.insert(0, bundle)
    module_name, _, fn_name = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        _fail(f"cannot import {module_name} from the bundle: {exc}")
    origin = getattr(module, "__file__", None) or ""
    if not origin.startswith(bundle + os.sep):
        _fail(f"module {module_name} is not the bundle's (it is {origin or 'built in'})")
    fn = getattr(module, fn_name, None)
    if fn_name.startswith("_") or not inspect.isfunction(fn) or fn.__module__ != module_name:
        _fail(f"{entry} is not a public function defined in {module_name}")
    try:
        value = fn(**job["kwargs"])
    except TypeError as exc:
        if exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
            _fail(f"{entry}: {exc}")  # the call itself: the wrong keywords
        raise
    try:
        data, kind = values.encode(value, job["declared"])
    except values.BadValue as exc:
        _fail(f"{entry} returned what cannot be its output: {exc}")
    out.write(kind.encode() + b"\n" + data)
    out.flush()


if __name__ == "__main__":
    main()
