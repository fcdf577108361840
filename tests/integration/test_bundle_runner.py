"""Shipped Python code in a process of its own: the bundle's function only, bounded in time
and output, killed when past its limit."""

from __future__ import annotations

import asyncio
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent import values
from edge_agent.bundle_runner import run_bundle
from edge_agent.executors import ExecutionError, Output
from schemas.pipeline import PythonRun
from tests.integration.test_exec_runner import dead

SOURCE = """
import os
import socket
import time


def scale(x, by=2):
    return x * by


def slow(pid_file, port=None):
    with open(pid_file, "w") as fh:
        fh.write(str(os.getpid()))
    if port is not None:  # and says so to the test listening on it
        said = socket.create_connection(("127.0.0.1", port))
        said.sendall(b"%d\\n" % os.getpid())
    time.sleep(30)


def chatty():
    print("x" * 100_000)  # to stderr, not the output
    return b"ok"


def big():
    return b"y" * 5000


def boom():
    raise ValueError("boom")
"""


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "b"  # the cache names files by digest only: no .zip
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("shipped_ops.py", SOURCE)
    return path


async def call(bundle: Path, entry: str, timeout_s: float = 20.0, **kw: Any) -> Output:
    run = PythonRun(entry=entry, kwargs=kw.pop("kwargs", {}), bundle="b@" + "0" * 64)
    return await run_bundle(
        run, bundle, allowed=kw.pop("allowed", True), timeout_s=timeout_s,
        max_output_bytes=1000, **kw,
    )  # fmt: skip


async def test_the_bundles_function_takes_its_inputs_and_returns_a_typed_output(
    bundle: Path,
) -> None:
    out = await call(bundle, "shipped_ops:scale", inputs={"x": np.arange(3)}, kwargs={"by": 3})
    assert out.media_type == values.NPY
    assert values.decode(out.data).tolist() == [0, 3, 6]
    assert (await call(bundle, "shipped_ops:chatty")).data == b"ok"


async def test_only_the_bundles_public_functions_run_and_only_where_allowed(
    bundle: Path,
) -> None:
    with pytest.raises(ExecutionError, match="allow_shipped_code is off"):
        await call(bundle, "shipped_ops:scale", allowed=False, kwargs={"x": 1})
    with pytest.raises(ExecutionError, match="module os is not the bundle's"):
        await call(bundle, "os:getcwd")
    with pytest.raises(ExecutionError, match="private functions are never callable"):
        await call(bundle, "shipped_ops:_hidden")
    with pytest.raises(ExecutionError, match=r"^exit code 1: ValueError: boom\n"):
        await call(bundle, "shipped_ops:boom")
    with pytest.raises(ExecutionError, match="output of 5000 bytes exceeds the limit of 1000"):
        await call(bundle, "shipped_ops:big")


async def test_past_its_time_limit_the_process_is_killed(bundle: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with pytest.raises(ExecutionError, match="timed out after 1 s; process killed"):
        await call(bundle, "shipped_ops:slow", timeout_s=1.0, kwargs={"pid_file": str(pid_file)})
    assert dead(int(pid_file.read_text()))
    pid_file.unlink()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def hear(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started.set_result(int(await reader.readline()))  # its pid file written, it sleeps
        writer.close()

    async with await asyncio.start_server(hear, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        task = asyncio.ensure_future(
            call(bundle, "shipped_ops:slow", kwargs={"pid_file": str(pid_file), "port": port})
        )
        async with asyncio.timeout(20.0):  # as long as the call itself may take
            await started
    task.cancel()  # withdrawn: killed too
    with pytest.raises(asyncio.CancelledError):
        await task
    assert dead(int(pid_file.read_text()))
