"""`python` tasks in a fresh Python process of their own (`run_child`), which calls the entry and
returns its output (`py_child.py`): an allowlisted module's function (`py_runner`), or one whose
code is shipped with the task (`PythonRun.bundle`, `run_bundle`): the bundle (a zip or wheel,
fetched and verified: `edge_agent.artifacts`) first on the process's path.

A process, not a thread: the call may be stopped (past its time limit, or cancelled, its whole
process group is killed), a crash of the interpreter fails the task and not the agent, two
bundles with modules of the same name never meet, and nothing the call imports stays in the
agent. It starts with `-I` (no environment variables, no user site), the environment `PATH`
only, stdin the call's keywords, a fresh working directory removed afterwards, and resource
limits set before the call: memory (`RLIMIT_DATA`: heap and private mappings, not the shared
libraries; `DEFAULT_MEMORY_MB` unless the caller says otherwise), CPU time (never less than the
time limit allows on every core: a backstop for a process the agent can no longer kill), open
files, no core dumps. It runs with the agent's rights: only owners who allow shipped code
(`allow_shipped_code`) run bundles, which admission and `run_bundle` both check; an
allowlisted module is checked by `py_runner` against `python_allow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pickle
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Required, TypedDict, Unpack, cast, get_args

from edge_agent.allowlist import bundle_problem
from edge_agent.executors import ExecutionError, Output
from edge_agent.py_child import ERROR
from schemas.pipeline import MediaType, PythonRun

CHILD = Path(__file__).resolve().parent / "py_child.py"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
CHUNK = 1 << 16
STDERR_TAIL = 2048
#: Room on stdout beyond the output's bytes: its media type, or why the call failed.
MARGIN = 4096
#: Longest wait for a killed process's pipes and exit status.
REAP_S = 5.0
#: Memory a call may allocate (MiB; `None`: no limit) unless its caller says otherwise.
DEFAULT_MEMORY_MB = 4096
OPEN_FILES = 1024
_MEDIA = {m.encode() for m in get_args(MediaType)}


def rlimits(timeout: float, memory_mb: int | None) -> dict[str, tuple[int, int]]:
    """The child's resource limits: resource name -> (soft, hard). Past the soft CPU limit the
    process gets SIGXCPU; it may use every core for its whole time limit."""
    cpu = math.ceil(timeout * (os.cpu_count() or 1)) + 1
    limits = {
        "RLIMIT_CPU": (cpu, cpu + 1),
        "RLIMIT_NOFILE": (OPEN_FILES, OPEN_FILES),
        "RLIMIT_CORE": (0, 0),
    }
    if memory_mb is not None:
        limits["RLIMIT_DATA"] = (memory_mb << 20, memory_mb << 20)
    return limits


async def _read_bounded(stream: asyncio.StreamReader, limit: int, shown: int) -> bytes:
    buf = bytearray()
    while chunk := await stream.read(CHUNK):
        if len(buf) + len(chunk) > limit:
            raise ExecutionError(f"output exceeded {shown} bytes; process killed")
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


def _exit_error(code: int, said: str, cpu_s: int) -> ExecutionError:
    """Why the process ended badly: its status (the signal that ended it), and what it said
    last on stderr (a traceback's last line says what was raised), then the end of it."""
    why = f"exit code {code}"
    if code < 0:
        with contextlib.suppress(ValueError):
            sig = signal.Signals(-code)
            why += f" ({sig.name}" + (
                f": past its CPU time limit of {cpu_s} s)" if sig == signal.SIGXCPU else ")"
            )
    last = said.rpartition("\n")[2]
    if last:
        why += f": {last}"
    if last != said:
        why += f"\n{said[-1000:]}"
    return ExecutionError(why)


class CallArgs(TypedDict, total=False):
    """The keywords of `run_child` beyond where the module is found, which `run_bundle` and
    `run_python` take and hand on as they are (`memory_mb`: `DEFAULT_MEMORY_MB` unless
    given)."""

    timeout_s: Required[float]
    max_output_bytes: Required[int]
    memory_mb: int | None
    inputs: dict[str, Any] | None
    declared: MediaType | None


async def run_child(
    run: PythonRun,
    where: dict[str, Any],
    *,
    timeout_s: float,
    max_output_bytes: int,
    memory_mb: int | None = DEFAULT_MEMORY_MB,
    inputs: dict[str, Any] | None = None,
    declared: MediaType | None = None,
) -> Output:
    """Call `run.entry` with its kwargs and inputs (decoded) as keywords in a fresh process,
    its module found as `where` says: `{"bundle": path}` or `{"path": sys.path}`."""
    kwargs: dict[str, Any] = dict(run.kwargs)
    clash = sorted(set(kwargs) & set(inputs or {}))
    if clash:
        raise ExecutionError(f"{', '.join(clash)}: both a kwarg and an input")
    kwargs.update(inputs or {})
    timeout = min(run.timeout_s, timeout_s)
    limits = rlimits(timeout, memory_mb)
    how = {**where, "limits": limits, "max_output_bytes": max_output_bytes}
    job = pickle.dumps(how, protocol=pickle.HIGHEST_PROTOCOL) + pickle.dumps(
        {"kwargs": kwargs, "declared": declared}, protocol=pickle.HIGHEST_PROTOCOL
    )
    cwd = tempfile.mkdtemp(prefix="mars-python-")
    proc: asyncio.subprocess.Process | None = None
    err: asyncio.Task[bytes] | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(CHILD), run.entry,
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
                out = await _read_bounded(proc.stdout, max_output_bytes + MARGIN, max_output_bytes)
                code = await proc.wait()
        except TimeoutError:
            raise ExecutionError(f"timed out after {timeout:g} s; process killed") from None
        except (BrokenPipeError, ConnectionResetError):
            code, out = await proc.wait(), b""
        head, _, data = out.partition(b"\n")
        if head == ERROR:  # the call could not be made, or its result not be the output
            raise ExecutionError(data.decode("utf-8", "replace"))
        if code != 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # nothing of it left to hold stderr open
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(err), REAP_S)
            said = (err.result() if err.done() else b"").decode("utf-8", "replace").strip()
            raise _exit_error(code, said, limits["RLIMIT_CPU"][0])
        if head not in _MEDIA:
            raise ExecutionError("the task's process wrote no output")
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


async def run_bundle(
    run: PythonRun, bundle: Path, *, allowed: bool, **call: Unpack[CallArgs]
) -> Output:
    """Call `run.entry` from `bundle`, where shipped code is `allowed`."""
    if (problem := bundle_problem(run.entry, allowed)) is not None:
        raise ExecutionError(f"not allowed: {problem}")
    return await run_child(run, {"bundle": str(bundle)}, **call)
