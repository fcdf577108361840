"""`mars sim` knows the processes it started by the argv it started them with: a wall clock
stepped between `up` and `down` moves the start time psutil reports, and must not make a live
fleet look gone (it was left running); a pid reused by another program is not ours."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from sim import launcher
from sim.launcher import ProcRecord


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that lives until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdin is not None
        proc.stdin.close()


def record(proc: subprocess.Popen[bytes], argv: list[str], created_shift_s: float) -> ProcRecord:
    import psutil

    created = psutil.Process(proc.pid).create_time() + created_shift_s
    return ProcRecord("agent", "a", proc.pid, created, "/dev/null", argv)


def test_a_process_started_with_the_recorded_argv_is_ours_whatever_the_clock_did(
    sleeper: subprocess.Popen[bytes],
) -> None:
    argv = [str(a) for a in sleeper.args]  # type: ignore[union-attr]
    assert launcher._ours(record(sleeper, argv, 0.0)) is not None
    assert launcher._ours(record(sleeper, argv, -4.4)) is not None  # the clock stepped since


def test_a_pid_running_another_program_is_not_ours(sleeper: subprocess.Popen[bytes]) -> None:
    assert launcher._ours(record(sleeper, ["nats-server", "-p", "4222"], 0.0)) is None


def test_a_state_file_without_argv_falls_back_on_the_start_time(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert launcher._ours(record(sleeper, [], 0.0)) is not None
    assert launcher._ours(record(sleeper, [], 30.0)) is None


def test_a_gone_process_is_not_ours() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    argv = [str(a) for a in proc.args]  # type: ignore[union-attr]
    proc.wait()  # reaped: the pid names nothing
    assert launcher._ours(ProcRecord("agent", "a", proc.pid, 0.0, "/dev/null", argv)) is None


def test_a_process_looked_at_as_soon_as_it_started_is_ours() -> None:
    """`Popen` returns once the child's exec is under way; for a moment after, its arguments
    read empty. Looked at then (as `mars sim up` looks at a server it has just started), it
    is known by its start time. Before, it was taken for gone: the server "exited at start"
    (~15-70% of 300 looks on the 2-core machine), and the clean-up left it running."""
    import psutil

    argv = ["sleep", "30"]
    missed = []
    for i in range(300):
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            created = psutil.Process(proc.pid).create_time()  # as `launcher._record` does
            rec = ProcRecord("nats", "n", proc.pid, created, "/dev/null", argv)
            if launcher._ours(rec) is None:
                missed.append(i)
        finally:
            proc.kill()
            proc.wait()
    assert missed == []
