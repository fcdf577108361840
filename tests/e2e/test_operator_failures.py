"""The operator's failure paths, as `mars` meets them: a dead or drained agent in `mars
agents`, a server out of reach, nobody to answer, a wait that runs out, a closed pipe."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.harness import agent_config, mars_cli, start_cluster, stop_cluster
from tests.integration.test_recovery import ClusterEvents
from transport.client import Client

pytestmark = pytest.mark.e2e

#: A process that should end at once gets this long (a Python start on a loaded machine).
PROMPT_S = 30.0


@pytest.fixture
def closed_url() -> Iterator[str]:
    """A URL nothing listens on: a port held by a socket that never listens."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"nats://127.0.0.1:{held.getsockname()[1]}"


async def test_mars_agents_shows_a_dead_agent_silent_since_last_heard_and_a_drained_one_draining(
    nats_url: str,
) -> None:
    """A dead agent's last_seen is -inf in the cluster view: `mars agents` failed with
    `error internal: ValidationError ... last_seen_s` during every incident; and a drained
    agent showed as `silent`."""
    cfg = agent_config("s", "edge", cpu_slots=1)
    orch, agents = await start_cluster(nats_url, {"keep": cfg, "victim": cfg})
    events = ClusterEvents()
    await events.start(nats_url)
    client = await Client.connect(nats_url)
    try:
        await agents[1].stop()
        await events.wait("agent_dead", "victim", timeout=10.0)
        rc, out, err = await mars_cli("agents", "--nats", nats_url)
        assert rc == 0, out + err
        lines = {line.split()[0]: line for line in out.splitlines()}
        assert lines["keep"].split()[1] == "alive", out
        victim = lines["victim"]
        assert victim.split()[1] == "silent" and re.search(r" last_seen=\d+\.\ds ago$", victim)

        rc, out, err = await mars_cli("drain", "keep", "--nats", nats_url)
        assert rc == 0 and "agent keep: draining" in out, out + err
        deadline = time.monotonic() + 10.0  # the next heartbeat says it (every 0.2 s)
        while not (await client.agents()).agents[0].draining:
            assert time.monotonic() < deadline, "the orchestrator never heard keep drain"
            await asyncio.sleep(0.05)  # polling the API, with a deadline
        rc, out, err = await mars_cli("agents", "--nats", nats_url)
        assert rc == 0, out + err
        keep = next(line for line in out.splitlines() if line.startswith("keep "))
        assert keep.split()[1] == "draining" and "last_seen" not in keep, out
    finally:
        await client.close()
        await events.stop()
        await stop_cluster(orch, agents[:1])


async def test_nobody_to_answer_is_said_in_words(nats_url: str) -> None:
    """No orchestrator up, or no agent of that id: said as what it means, not as
    `NoRespondersError: nats: no responders available for request`."""
    for args in (["list"], ["agents"], ["status", "p1"]):
        rc, out, err = await mars_cli(*args, "--nats", nats_url)
        assert rc == 2 and out == "", (args, out, err)
        assert err.strip() == (
            f"error: no orchestrator replica answered at {nats_url}: is `mars orchestrator` "
            "running there?"
        ), args
    rc, out, err = await mars_cli("drain", "nosuch", "--nats", nats_url)
    assert rc == 2 and out == "", out + err
    assert err.strip() == (
        f"error: no agent nosuch at {nats_url}: no agent with that id answered (`mars agents` "
        "lists them)"
    )


async def test_submit_wait_that_runs_out_says_the_pipeline_runs_on(
    nats_url: str, tmp_path: Path
) -> None:
    """`submit --wait --timeout` that passes printed `error: TimeoutError: ` and nothing else."""
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=1)})
    try:
        slow = tmp_path / "slow.yaml"
        slow.write_text("name: slow\ntasks: [{id: t, run: {kind: synthetic, seconds: 60}}]\n")
        rc, out, err = await mars_cli(
            "submit", str(slow), "--wait", "--timeout", "0.5", "--id", "slow1", "--nats", nats_url
        )
        assert rc == 3, out + err
        assert err.strip() == (
            "pipeline slow1: still running after 0.5 s (--timeout); it keeps running: follow "
            "it with `mars status slow1`, stop it with `mars cancel slow1`"
        )
        assert (await orch.status_of("slow1")).state == "running"
    finally:
        await stop_cluster(orch, agents)


async def _into_closed_pipe(*args: str) -> tuple[int, str]:
    """`mars ARGS` writing to a pipe nobody reads any more: (exit code, stderr)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console.cli", *args,
            stdout=write_end, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
    finally:
        os.close(write_end)
    _, err = await asyncio.wait_for(proc.communicate(), PROMPT_S)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def test_output_into_a_closed_pipe_ends_quietly(nats_url: str, tmp_path: Path) -> None:
    """`mars ... | head`: no BrokenPipeError traceback, the exit status of a tool SIGPIPE
    ended; whether the pipe closes mid-output (`schema`: ~100 KiB) or before a short one is
    flushed at exit (`schema --out`, `list` through the API)."""
    sigpipe = 128 + signal.SIGPIPE
    assert await _into_closed_pipe("schema") == (sigpipe, "")
    assert await _into_closed_pipe("schema", "--out", str(tmp_path)) == (sigpipe, "")
    orch, agents = await start_cluster(nats_url, {"a": agent_config("s", "edge", cpu_slots=1)})
    try:
        assert await _into_closed_pipe("agents", "--nats", nats_url) == (sigpipe, "")
    finally:
        await stop_cluster(orch, agents)


@contextlib.asynccontextmanager
async def service_process(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`mars ARGS` (a service) as a process of its own, its stderr piped; killed after, if
    it did not end."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "console.cli", *args,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("service", ["agent", "orchestrator"])
async def test_a_service_that_cannot_reach_its_server_says_so_and_exits(
    service: str, closed_url: str
) -> None:
    """Before, it printed nothing (even with -v), ignored the first SIGTERM and ran for good."""
    async with service_process(service, "--nats", closed_url) as proc:
        _, raw = await asyncio.wait_for(proc.communicate(), PROMPT_S)
        err = raw.decode()
        assert proc.returncode == 2, err
        assert err.startswith(f"error: cannot reach NATS at {closed_url}: "), err
        assert "--retry-connect" in err and "Traceback" not in err


@pytest.mark.parametrize("service", ["agent", "orchestrator"])
async def test_retry_connect_says_each_failure_and_stops_on_the_first_sigterm(
    service: str, closed_url: str
) -> None:
    async with service_process(service, "--nats", closed_url, "--retry-connect") as proc:
        assert proc.stderr is not None
        said = []
        for _ in range(2):  # the first failure, and the next after a longer wait
            line = await asyncio.wait_for(proc.stderr.readline(), PROMPT_S)
            said.append(line.decode())
        assert all(f"cannot reach NATS at {closed_url}: " in s for s in said), said
        assert [re.sub(r".*trying again in ", "", s).strip() for s in said] == ["0.5 s", "1 s"]
        assert proc.returncode is None
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10.0) == 0
