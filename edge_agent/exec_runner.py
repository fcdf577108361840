"""The `exec` executor: an allowlisted argv, no shell, bounded in time and output.

The process gets its own session (so the whole group can be killed), a declared environment
(PATH, HOME and TMPDIR in its working directory, a C.UTF-8 locale, and its inputs' and output
directory's paths: no inherited secrets), stdin from /dev/null, and a fresh working directory
that is removed afterwards, with its inputs as files in `in/` and `out/` for what it writes.
The allowlist judges the argv as the task wrote it, templates and all; the paths go in after.
Timeout, an output over the limit and cancellation all kill the process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Mapping
from pathlib import Path

from edge_agent.allowlist import ExecRule, match_exec
from edge_agent.executors import ExecutionError, Output
from schemas.pipeline import ExecRun

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
STDERR_TAIL = 2048
CHUNK = 1 << 16
#: Longest the runner waits for a killed process's pipes and exit status.
REAP_S = 5.0
#: `{in:NAME}` and `{out}` in an argument.
TEMPLATE = re.compile(r"\{in:([A-Za-z0-9_.-]+)\}|\{out\}")

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


def _lay_out(cwd: str, inputs: Mapping[str, bytes]) -> tuple[dict[str, str], Path]:
    """`in/` with each input as a file, and an empty `out/`: the inputs' paths, and out's."""
    in_dir, out_dir = Path(cwd, "in"), Path(cwd, "out")
    in_dir.mkdir()
    out_dir.mkdir()
    paths: dict[str, str] = {}
    for name, data in inputs.items():
        path = in_dir / name
        path.write_bytes(data)
        paths[name] = str(path)
    return paths, out_dir


def _output_file(path: Path, limit: int) -> bytes:
    """The output file the command was to write: missing, or over the limit, is an error."""
    if not path.is_file():
        made = ", ".join(sorted(p.name for p in path.parent.iterdir())) or "nothing"
        raise ExecutionError(f"wrote no output file {path.name} (its output dir holds {made})")
    size = path.stat().st_size
    if size > limit:
        raise ExecutionError(f"output file {path.name} of {size} bytes exceeds {limit} bytes")
    return path.read_bytes()


async def _tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    """Drain stderr so the child never blocks on it, keeping only its last `keep` bytes."""
    tail = b""
    while chunk := await stream.read(CHUNK):
        tail = (tail + chunk)[-keep:]
    return tail


def env_name(name: str) -> str:
    """`MARS_IN_` + the input's name in upper case, anything but letters and digits `_`."""
    return "MARS_IN_" + re.sub(r"[^A-Z0-9]", "_", name.upper())


def fill(argv: list[str], paths: Mapping[str, str], out_dir: str) -> list[str]:
    """The argv with `{in:NAME}` and `{out}` replaced by paths; an unknown input is an error."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return out_dir
        if m.group(1) not in paths:
            have = ", ".join(sorted(paths)) or "none"
            raise ExecutionError(f"argument names input {m.group(1)!r}; its inputs: {have}")
        return paths[m.group(1)]

    return [TEMPLATE.sub(sub, a) for a in argv]


async def run_exec(
    run: ExecRun,
    rules: tuple[ExecRule, ...] | list[ExecRule],
    *,
    timeout_s: float,
    max_output_bytes: int,
    work_dir: str | None = None,
    inputs: Mapping[str, bytes] | None = None,
) -> Output:
    """Run `run.argv` if the allowlist passes it (checked here again, whatever admission said),
    its inputs as files."""
    argv, why = match_exec(run.argv, rules)
    if argv is None:
        raise ExecutionError(f"not allowlisted: {why}")
    timeout = min(run.timeout_s, timeout_s)
    cwd = tempfile.mkdtemp(prefix="mars-exec-", dir=work_dir)
    paths, out_dir = await asyncio.to_thread(_lay_out, cwd, inputs or {})
    env = {
        "PATH": SAFE_PATH, "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8",
        "MARS_OUT": str(out_dir), **{env_name(n): p for n, p in paths.items()},
    }  # fmt: skip
    proc: asyncio.subprocess.Process | None = None
    err_task: asyncio.Task[bytes] | None = None
    try:
        argv = fill(argv, paths, str(out_dir))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
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
        if run.output != "stdout":
            out = await asyncio.to_thread(_output_file, out_dir / run.output, max_output_bytes)
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
