"""`python` tasks of allowlisted modules run in a process of their own: killed past their time
limit or when cancelled, bounded in memory, and a crash of theirs is the task's error only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from edge_agent.bundle_runner import DEFAULT_MEMORY_MB, OPEN_FILES, rlimits
from edge_agent.executors import ExecutionError, Output
from edge_agent.py_runner import run_python
from schemas import PipelineSpec
from schemas.pipeline import PythonRun
from tests.harness import EMULATED_CPU, agent_config, start_cluster, stop_cluster
from tests.integration.test_exec_runner import dead, read_fifo

pytestmark = pytest.mark.integration

MODS = ["tests.integration.pytasks", "edge_agent.builtin_tasks"]
REPO = Path(__file__).resolve().parents[2]


async def call(entry: str, timeout_s: float = 30.0, **kw: Any) -> Output:
    run = PythonRun(entry=entry, kwargs=kw.pop("kwargs", {}))
    return await run_python(run, MODS, timeout_s=timeout_s, max_output_bytes=1 << 20, **kw)


async def test_past_its_time_limit_the_process_is_killed(tmp_path: Path) -> None:
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    job = asyncio.create_task(
        call("tests.integration.pytasks:hold", timeout_s=2.0, kwargs={"fifo": str(fifo)})
    )
    pid = int(await asyncio.to_thread(read_fifo, fifo))
    with pytest.raises(ExecutionError, match=r"^timed out after 2 s; process killed$"):
        await job
    assert dead(pid, within=0)  # gone by the time the task failed


async def test_cancel_kills_the_process(tmp_path: Path) -> None:
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    job = asyncio.create_task(call("tests.integration.pytasks:hold", kwargs={"fifo": str(fifo)}))
    pid = int(await asyncio.to_thread(read_fifo, fifo))
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert dead(pid, within=0)


async def test_past_its_memory_limit_the_call_fails_saying_so() -> None:
    with pytest.raises(
        ExecutionError,
        match=r"^tests\.integration\.pytasks:allocate ran out of memory \(its memory limit is "
        r"256 MiB\): MemoryError: Unable to allocate 1\.00 GiB",
    ):
        await call("tests.integration.pytasks:allocate", memory_mb=256, kwargs={"mib": 1024})
    assert (await call("tests.integration.pytasks:allocate", kwargs={"mib": 64})).data == b"8388608"


async def test_numpy_and_onnxruntime_work_under_the_default_limits() -> None:
    assert (await call("tests.integration.pytasks:heavy_imports")).data == b"[1.0]"


async def test_a_crashed_interpreter_fails_the_task_and_not_the_agent() -> None:
    with pytest.raises(ExecutionError, match=r"^exit code 3$"):
        await call("tests.integration.pytasks:exit_now")
    with pytest.raises(ExecutionError, match=r"^exit code -11 \(SIGSEGV\)"):
        await call("tests.integration.pytasks:segfault")
    out = await call("edge_agent.builtin_tasks:describe", kwargs={"a": 1})  # and on it goes
    assert out.data == b'{"count":1,"kwargs":{"a":1}}'


async def test_the_process_has_its_limits_a_bare_environment_and_a_removed_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MARS_SECRET_TOKEN", "hunter2")
    out = await call("tests.integration.pytasks:where", timeout_s=10.0, memory_mb=512)
    seen = json.loads(out.data)
    # nothing inherited: PATH, and what Python (locale coercion) and edge_agent set themselves
    assert seen["env"]["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert set(seen["env"]) <= {"PATH", "LC_CTYPE", "ORT_DISABLE_TELEMETRY"}, seen["env"]
    assert Path(seen["cwd"]).name.startswith("mars-python-") and not Path(seen["cwd"]).exists()
    assert seen["pid"] != os.getpid()
    cpu = rlimits(10.0, 512)["RLIMIT_CPU"]
    assert seen["limits"] == {
        "RLIMIT_DATA": [512 << 20, 512 << 20], "RLIMIT_CPU": list(cpu),
        "RLIMIT_NOFILE": [OPEN_FILES, OPEN_FILES], "RLIMIT_CORE": [0, 0],
    }  # fmt: skip
    assert cpu[0] >= 10 * (os.cpu_count() or 1)  # never less than the wall clock allows
    assert "RLIMIT_DATA" not in rlimits(10.0, None) and DEFAULT_MEMORY_MB >= 1024


async def test_only_functions_defined_in_an_allowlisted_module_are_called() -> None:
    mods = ["edge_agent.exec_runner"]
    for entry in ("edge_agent.exec_runner:match_exec", "edge_agent.exec_runner:os"):
        with pytest.raises(ExecutionError, match="is not a public function defined in"):
            await run_python(PythonRun(entry=entry), mods, timeout_s=30, max_output_bytes=100)
    with pytest.raises(ExecutionError, match=r"^cannot import edge_agent\.nope: No module"):
        await run_python(
            PythonRun(entry="edge_agent.nope:f"), ["edge_agent"], timeout_s=30,
            max_output_bytes=100,
        )  # fmt: skip


async def test_a_call_ends_with_its_agent_killed_outright(tmp_path: Path) -> None:
    """An agent SIGKILLed mid-call leaves no call running on (Linux: the parent-death signal)."""
    fifo = tmp_path / "pid"
    os.mkfifo(fifo)
    agent = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        "import asyncio, sys; from tests.integration.test_python_process import call; "
        "asyncio.run(call('tests.integration.pytasks:hold', kwargs={'fifo': sys.argv[1]}))",
        str(fifo), cwd=str(REPO),
    )  # fmt: skip
    pid = 0
    try:
        pid = int(await asyncio.to_thread(read_fifo, fifo))
        agent.kill()
        await agent.wait()
        assert dead(pid, within=10.0)
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
        if pid:  # (a failure above must not leave it sleeping)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_an_agents_python_memory_limit_is_its_tasks(nats_url: str) -> None:
    cfg = agent_config(
        "s1", "edge", probe_cpu=False, devices=[EMULATED_CPU], allowed_kinds=["python"],
        python_allow=MODS, python_memory_mb=128,
    )  # fmt: skip
    orch, agents = await start_cluster(nats_url, {"a1": cfg})
    try:
        spec = PipelineSpec.model_validate({"name": "big", "tasks": [
            {"id": "t", "run": {"kind": "python", "entry": "tests.integration.pytasks:allocate",
                                "kwargs": {"mib": 256}}},
        ]})  # fmt: skip
        await orch.submit_spec(spec, "big")
        run = await orch.wait_terminal("big", 30.0)
        assert run.state == "failed"
        assert "ran out of memory (its memory limit is 128 MiB)" in run.reason, run.reason
    finally:
        await stop_cluster(orch, agents)
