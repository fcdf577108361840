"""`python` tasks whose code is shipped with them (`PythonRun.bundle`): the bundle (a zip or
wheel, fetched and verified: `edge_agent.artifacts`) first on the path of a fresh Python
process, which calls the entry and returns its output (`bundle_child.py`).

A process, not a thread: shipped code may be stopped (past its time limit, or cancelled, its
whole process group is killed), two bundles with modules of the same name never meet, and
nothing it imports stays in the agent. It starts with `-I` (no environment variables, no user
site), the environment `PATH` only, stdin the call's keywords, and a fresh working directory
removed afterwards. It runs with the agent's rights: only owners who allow shipped code
(`allow_shipped_code`) run it, which admission and this runner both check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, cast, get_args

from edge_agent.allowlist import bundle_problem
from edge_agent.executors import ExecutionError, Output
from schemas.pipeline import MediaType, PythonRun

CHILD = Path(__file__).resolve().parent / "bundle_child.py"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
CHUNK = 1 << 16
STDERR_TAIL = 2048
#: Longest wait for a killed process's pipes and exit status.
REAP_S = 5.0
_MEDIA = {m.encode() for m in get_args(MediaType)}


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    buf = bytearray()
    while chunk := await stream.read(CHUNK):
        if len(buf) + len(chunk) > limit:
            raise ExecutionError(f"output exceeded {limit} bytes; process killed")
        buf += chunk
    return bytes(buf)


async def _tail(stream: asyncio.StreamReader) -> bytes:
    tail = b""
    while chunk := await stream.read(CHUNK):
        tail = (tail + chunk)[-STDERR_TAIL:]
    return tail


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Kill the process group and wait for it, bounded."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        async with asyncio.timeout(REAP_S):
            if proc.stdout is not None:
                while await proc.stdout.read(CHUNK):
                    pass
            await proc.wait()


async def run_bundle(
    run: PythonRun,
    bundle: Path,
    *,
    allowed: bool,
    timeout_s: float,
    max_output_bytes: int,
    inputs: dict[str, Any] | None = None,
    declared: MediaType | None = None,
) -> Output:
    """Call `run.entry` from `bundle` with its kwargs and inputs (decoded) as keywords."""
    problem = bundle_problem(run.entry, allowed)
    if problem is not None:
        raise ExecutionError(f"not allowed: {problem}")
    kwargs: dict[str, Any] = dict(run.kwargs)
    clash = sorted(set(kwargs) & set(inputs or {}))
    if clash:
        raise ExecutionError(f"{', '.join(clash)}: both a kwarg and an input")
    kwargs.update(inputs or {})
    job = pickle.dumps({"kwargs": kwargs, "declared": declared}, protocol=pickle.HIGHEST_PROTOCOL)
    timeout = min(run.timeout_s, timeout_s)
    cwd = tempfile.mkdtemp(prefix="mars-bundle-")
    proc: asyncio.subprocess.Process | None = None
    err: asyncio.Task[bytes] | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(CHILD), str(bundle), run.entry,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=cwd, env={"PATH": SAFE_PATH},
            start_new_session=True, close_fds=True,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        err = asyncio.create_task(_tail(proc.stderr))
        try:
            async with asyncio.timeout(timeout):
                proc.stdin.write(job)
                await proc.stdin.drain()
                proc.stdin.close()
                out = await _read_bounded(proc.stdout, max_output_bytes + 64)
                code = await proc.wait()
        except TimeoutError:
            raise ExecutionError(f"timed out after {timeout:g} s; process killed") from None
        except (BrokenPipeError, ConnectionResetError):
            code, out = await proc.wait(), b""
        if code != 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # nothing of it left to hold stderr open
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(err), REAP_S)
            said = (err.result() if err.done() else b"").decode("utf-8", "replace").strip()
            last = said.rpartition("\n")[2]  # a traceback's last line says what was raised
            raise ExecutionError(
                f"exit code {code}: {last}" + (f"\n{said[-1000:]}" if last != said else "")
            )
        head, _, data = out.partition(b"\n")
        if head not in _MEDIA:
            raise ExecutionError("the bundle's process wrote no output")
        if len(data) > max_output_bytes:
            raise ExecutionError(
                f"output of {len(data)} bytes exceeds the limit of {max_output_bytes}"
            )
        kind = cast(MediaType, head.decode())
        return Output(data, f"{run.entry.partition(':')[2]} -> {len(data)} B {kind}", kind)
    finally:
        if proc is not None:
            await _stop(proc)
        if err is not None:
            err.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await err
        shutil.rmtree(cwd, ignore_errors=True)
