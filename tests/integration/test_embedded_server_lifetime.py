"""An embedded nats-server does not outlive the process that started it, however it ends."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

#: Starts an embedded server, says its pid, and waits for its stdin to close.
HOLDER = """
import sys
from orchestrator.infra.natsserver import EmbeddedNats
srv = EmbeddedNats(store_dir=sys.argv[1]).start()
print(srv.proc.pid, flush=True)
sys.stdin.read()
"""


def test_an_embedded_server_ends_with_a_process_killed_outright(tmp_path: Path) -> None:
    """SIGKILL (an OOM kill, a CI timeout) runs no cleanup: the server, told by the kernel
    that its parent died, stops by itself. It stayed on its port with its store before."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "nats")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    server = -1
    try:
        assert holder.stdout is not None
        server = int(holder.stdout.readline())
        pidfd = os.pidfd_open(server)
        try:
            assert not select.select([pidfd], [], [], 0)[0]  # serving
            holder.kill()
            holder.wait()
            assert select.select([pidfd], [], [], 10.0)[0], "the server outlived its parent"
        finally:
            os.close(pidfd)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if server > 0:  # (gone already unless the test failed)
            with contextlib.suppress(ProcessLookupError):
                os.kill(server, signal.SIGKILL)
