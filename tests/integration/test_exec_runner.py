"""The exec and python runners on real processes and threads (no NATS needed here)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.allowlist import ExecRule
from edge_agent.exec_runner import run_exec
from edge_agent.executors import ExecutionError
from edge_agent.py_runner import run_python
from schemas.pipeline import ExecRun, PythonRun

pytestmark = pytest.mark.integration

RULES = (
    ExecRule(path="printf", prefix=["%s\\0"], args=["(?s).*"], max_args=64),
    ExecRule(path="env"),
    ExecRule(path="pwd"),
    ExecRule(path="yes"),
    ExecRule(path="sh", prefix=["-c"], args=[".*"]),
)


async def run(argv: list[str], *, timeout: float = 5.0, limit: int = 1 << 20) -> bytes:
    spec = ExecRun(argv=argv, timeout_s=timeout)
    out = await run_exec(spec, RULES, timeout_s=timeout, max_output_bytes=limit)
    assert out.result == f"exit 0, {len(out.data)} B"
    return out.data


def dead(pid: int, within: float = 5.0) -> bool:
    """True once `pid` is gone (or a zombie nobody reaped yet); waits on it, bounded."""
    end = time.monotonic() + within
    while True:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
            proc.wait(0.05)
            return True
        except psutil.NoSuchProcess:
            return True
        except psutil.TimeoutExpired:
            if time.monotonic() > end:
                return False


def read_fifo(path: Path) -> str:
    with open(path, encoding="utf-8") as fh:  # blocks until the task opens it for writing
        return fh.read().strip()


@settings(max_examples=25, deadline=None)
@given(
    args=st.lists(
        st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20),
        min_size=1,
        max_size=8,
    )
)
def test_argv_reaches_the_process_verbatim(args: list[str]) -> None:
    # shell metacharacters, spaces, quotes, globs: no shell ever sees them
    data = asyncio.run(run(["printf", "%s\\0", *args]))
    assert [g.decode() for g in data.split(b"\0")[:-1]] == args


async def test_environment_is_minimal_and_cwd_is_a_fresh_removed_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MARS_SECRET_TOKEN", "hunter2")
    env = (await run(["env"])).decode()
    assert env.strip().splitlines() == ["PATH=/usr/local/bin:/usr/bin:/bin"]
    cwd = Path((await run(["pwd"])).decode().strip())
    assert cwd.name.startswith("mars-exec-") and not cwd.exists()


async def test_oversized_output_kills_the_process() -> None:
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match="output exceeded 1000 bytes; process killed"):
        await run(["yes"], limit=1000)  # `yes` never ends on its own
    assert time.monotonic() - t0 < 3.0


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    # a background grandchild too: killing only the direct child would leave it running
    script = f"sleep 30 & echo $$ $! > {fifo}; wait"
    job = asyncio.create_task(run(["sh", "-c", script], timeout=1.0))
    pids = [int(p) for p in (await asyncio.to_thread(read_fifo, fifo)).split()]
    with pytest.raises(ExecutionError, match=r"timed out after 1 s; process group killed"):
        await job
    assert all(dead(p) for p in pids), pids


async def test_nonzero_exit_fails_with_stderr() -> None:
    with pytest.raises(ExecutionError, match="exit code 3: boom"):
        await run(["sh", "-c", "echo boom >&2; exit 3"])


async def test_cancel_kills_the_process(tmp_path: Path) -> None:
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    job = asyncio.create_task(run(["sh", "-c", f"echo $$ > {fifo}; exec sleep 30"]))
    pid = int(await asyncio.to_thread(read_fifo, fifo))
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert dead(pid)


async def test_unlisted_argv_is_refused_at_run_time_too(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for argv in (["touch", str(marker)], ["sh", "-x", f"touch {marker}"]):
        with pytest.raises(ExecutionError, match="not allowlisted"):
            await run(argv)
    assert not marker.exists()


async def test_python_runner_calls_allowed_entries_only() -> None:
    mods = ["edge_agent.builtin_tasks"]
    out = await run_python(
        PythonRun(
            entry="edge_agent.builtin_tasks:resize", kwargs={"out_width": 4, "out_height": 2}
        ),
        mods,
        timeout_s=5.0,
        max_output_bytes=1000,
    )
    assert len(out.data) == 8 and out.result == "resize -> 8 B"
    with pytest.raises(ExecutionError, match="not allowlisted"):
        await run_python(PythonRun(entry="os:getcwd"), mods, timeout_s=5.0, max_output_bytes=1000)
    with pytest.raises(ExecutionError, match="exceeds the limit of 10"):
        await run_python(
            PythonRun(entry="edge_agent.builtin_tasks:resize"), mods, timeout_s=5.0,
            max_output_bytes=10,
        )  # fmt: skip
    with pytest.raises(ExecutionError, match="unexpected keyword"):
        await run_python(
            PythonRun(entry="edge_agent.builtin_tasks:checksum", kwargs={"nope": 1}), mods,
            timeout_s=5.0, max_output_bytes=1000,
        )  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(ExecutionError, match=r"timed out after 0\.2 s"):
        await run_python(
            PythonRun(entry="edge_agent.builtin_tasks:pause", kwargs={"seconds": 0.6}), mods,
            timeout_s=0.2, max_output_bytes=1000,
        )  # fmt: skip
    assert time.monotonic() - t0 < 0.5
