"""Which children are tied to their caller's life, and SIGTERM handled as Ctrl-C."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from orchestrator.infra.procs import terminate_as_interrupt, tied_to_caller

T = TypeVar("T")


def in_a_thread(fn: Callable[[], T]) -> T:
    out: list[T] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_only_a_child_started_on_the_main_thread_is_tied() -> None:
    """Linux signals a tied child when the thread that started it ends: one started from a
    worker thread (a server restarted through `asyncio.to_thread`) would die with that thread,
    so it is left untied."""
    assert callable(tied_to_caller())
    assert in_a_thread(tied_to_caller) is None


def test_sigterm_is_ctrl_c_inside_the_block_only() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with terminate_as_interrupt():
        assert signal.getsignal(signal.SIGTERM) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is before

    def from_a_thread() -> object:
        with terminate_as_interrupt():  # signal handlers are the main thread's to set
            return signal.getsignal(signal.SIGTERM)

    assert in_a_thread(from_a_thread) is before
