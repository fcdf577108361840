"""The exec and python runners on real processes (no NATS needed here)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent import values
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
    env = dict(line.split("=", 1) for line in (await run(["env"])).decode().splitlines())
    cwd = Path((await run(["pwd"])).decode().strip())
    assert cwd.name.startswith("mars-exec-") and not cwd.exists()
    home = env.pop("HOME")  # declared, nothing inherited
    assert home.startswith(str(cwd.parent)) and Path(home).name.startswith("mars-exec-")
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "TMPDIR": home, "LANG": "C.UTF-8",
        "MARS_OUT": f"{home}/out",
    }  # fmt: skip


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
    assert len(out.data) == 8 and out.result == "resize -> 8 B application/octet-stream"
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


async def test_inputs_are_files_named_in_argv_and_env_and_the_output_a_file_written() -> None:
    """`{in:NAME}` and `MARS_IN_NAME` are an input's path, `{out}` and `MARS_OUT` the output
    directory; the output is the named file the command wrote there."""
    spec = ExecRun(
        argv=["sh", "-c", 'tr a-z A-Z < {in:words} > "$MARS_OUT/up.txt"; cat "$MARS_IN_WORDS"'],
        output="up.txt",
    )
    out = await run_exec(
        spec, RULES, timeout_s=5.0, max_output_bytes=1 << 20, inputs={"words": b"edge to cloud"}
    )
    assert out.data == b"EDGE TO CLOUD"
    missing = ExecRun(argv=["sh", "-c", "echo to stdout only"], output="result.bin")
    with pytest.raises(ExecutionError, match=r"wrote no output file result\.bin"):
        await run_exec(missing, RULES, timeout_s=5.0, max_output_bytes=1 << 20)
    big = ExecRun(argv=["sh", "-c", "head -c 5000 /dev/zero > {out}/o"], output="o")
    with pytest.raises(ExecutionError, match="output file o of 5000 bytes exceeds 1000 bytes"):
        await run_exec(big, RULES, timeout_s=5.0, max_output_bytes=1000)
    unknown = ExecRun(argv=["sh", "-c", "cat {in:nope}"])
    with pytest.raises(ExecutionError, match="argument names input 'nope'; its inputs: words"):
        await run_exec(unknown, RULES, timeout_s=5.0, max_output_bytes=100, inputs={"words": b""})


async def test_a_python_task_gets_its_inputs_decoded_and_its_array_is_its_output() -> None:
    mods = ["edge_agent.builtin_tasks"]
    spec = PythonRun(entry="edge_agent.builtin_tasks:scale", kwargs={"by": 4})
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    out = await run_python(spec, mods, timeout_s=5.0, max_output_bytes=1 << 20, inputs={"x": a})
    assert out.media_type == values.NPY
    got = values.decode(out.data)
    assert got.dtype == np.float32 and np.array_equal(got, a / 4)
    with pytest.raises(ExecutionError, match="by: both a kwarg and an input"):
        await run_python(spec, mods, timeout_s=5.0, max_output_bytes=100, inputs={"x": a, "by": 2})
