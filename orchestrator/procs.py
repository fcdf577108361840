"""Child processes that never outlive their parent (demo, sim launcher, tests)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    args: Sequence[str],
    *,
    log: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `python -m orchestrator.cli ARGS` in its own session, tied to our lifetime
    (`env`: variables set on top of ours)."""
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=log or subprocess.DEVNULL,
        stderr=log or subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env} if env else None,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )


def stop_all(procs: Sequence[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(grace)
