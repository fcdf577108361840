"""The `exec` executor: an allowlisted argv, no shell, bounded in time and output.

The process gets its own session (so the whole group can be killed), an environment with
PATH only (no inherited secrets), stdin from /dev/null, and a fresh working directory that is
removed afterwards. Timeout, an oversized stdout and cancellation all kill the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile

from edge_agent.allowlist import ExecRule, match_exec
from edge_agent.executors import ExecutionError, Output
from schemas.pipeline import ExecRun

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
STDERR_TAIL = 2048
CHUNK = 1 << 16
#: Longest the runner waits for a killed process's pipes and exit status.
REAP_S = 5.0

log = logging.getLogger("mars.agent.exec")


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the task's whole process group (children it forked included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    buf = bytearray()
    while chunk := await stream.read(CHUNK):
        if len(buf) + len(chunk) > limit:
            raise ExecutionError(f"output exceeded {limit} bytes; process killed")
        buf += chunk
    return bytes(buf)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for a killed process without hanging. On Python 3.11 `wait()` returns only once
    every pipe has closed, and a stdout we stopped reading (output over the limit) is paused
    with data in it: drain it to EOF first, and bound both steps (a descendant that escaped
    the group kill could hold the pipe open)."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(REAP_S):
            if proc.stdout is not None:
                while await proc.stdout.read(CHUNK):
                    pass
    try:
        async with asyncio.timeout(REAP_S):
            await asyncio.shield(proc.wait())
    except TimeoutError:
        log.warning("exec pid %d: pipes still open after the kill; closing them", proc.pid)
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()
    except ProcessLookupError:
        pass


async def _tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    """Drain stderr so the child never blocks on it, keeping only its last `keep` bytes."""
    tail = b""
    while chunk := await stream.read(CHUNK):
        tail = (tail + chunk)[-keep:]
    return tail


async def run_exec(
    run: ExecRun,
    rules: tuple[ExecRule, ...] | list[ExecRule],
    *,
    timeout_s: float,
    max_output_bytes: int,
    work_dir: str | None = None,
) -> Output:
    """Run `run.argv` if the allowlist passes it (checked here again, whatever admission said)."""
    argv, why = match_exec(run.argv, rules)
    if argv is None:
        raise ExecutionError(f"not allowlisted: {why}")
    timeout = min(run.timeout_s, timeout_s)
    cwd = tempfile.mkdtemp(prefix="mars-exec-", dir=work_dir)
    proc: asyncio.subprocess.Process | None = None
    err_task: asyncio.Task[bytes] | None = None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env={"PATH": SAFE_PATH},
            start_new_session=True,
            close_fds=True,
        )
        assert proc.stdout is not None and proc.stderr is not None
        err_task = asyncio.create_task(_tail(proc.stderr, STDERR_TAIL))
        try:
            async with asyncio.timeout(timeout):
                out = await _read_bounded(proc.stdout, max_output_bytes)
                code = await proc.wait()
        except TimeoutError:
            raise ExecutionError(f"timed out after {timeout:g} s; process group killed") from None
        if code != 0:
            _kill_group(proc)
            err = (await err_task).decode("utf-8", "replace").strip()
            raise ExecutionError(f"exit code {code}: {err[-500:]}" if err else f"exit code {code}")
        return Output(out, f"exit 0, {len(out)} B")
    finally:
        if proc is not None:
            _kill_group(proc)  # timeout, cancel, oversize, or children left behind
            await _reap(proc)
        if err_task is not None:
            err_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await err_task
        shutil.rmtree(cwd, ignore_errors=True)
