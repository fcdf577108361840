"""Child processes that never outlive their parent (demo, benchmarks, tests), and a way for
the foreground commands that start them to stop them on SIGTERM too."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def tied_to_caller() -> Callable[[], None] | None:
    """A `preexec_fn` that has the child sent SIGTERM when the caller dies, however it dies
    (SIGKILL too); None where that cannot be promised. Linux sends it when the *thread* that
    started the child ends, so only a child started on the main thread is tied (one started
    from a worker thread would die with that thread, not with the process)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    return _die_with_parent


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside this block SIGTERM stops the process as Ctrl-C does (KeyboardInterrupt), so a
    foreground command that starts its own broker and services (`mars demo`, the benchmarks)
    stops them and removes its files when a service manager, `timeout` or `kill` asks it to
    stop: by default SIGTERM ends Python at once, without running any `finally`."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def spawn(
    args: Sequence[str],
    *,
    log: IO[bytes] | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `python -m console.cli ARGS` in its own session, tied to our lifetime
    (`env`: variables set on top of ours)."""
    return subprocess.Popen(
        [sys.executable, "-m", "console.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=log or subprocess.DEVNULL,
        stderr=log or subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env} if env else None,
        preexec_fn=tied_to_caller(),
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
