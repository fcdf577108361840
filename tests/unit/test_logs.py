"""Quiet by default; MARS_DEBUG opens the debug records of just the loggers it names."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from orchestrator.infra import logs


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    names = ("mars.timing", "mars.placement", "nats")
    levels = {n: logging.getLogger(n).level for n in names}
    yield None
    root.handlers[:], root.level = saved[0], saved[1]
    for n, lvl in levels.items():
        logging.getLogger(n).setLevel(lvl)


def test_mars_debug_opens_only_the_named_loggers(
    monkeypatch: pytest.MonkeyPatch, restore_logging: object
) -> None:
    monkeypatch.setenv("MARS_DEBUG", "mars.timing, ")
    logs.setup(0)
    assert logging.getLogger("mars.timing").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("mars.placement").isEnabledFor(logging.INFO)  # still quiet
    assert logging.getLogger().level == logging.WARNING


def test_without_mars_debug_debug_records_stay_off(
    monkeypatch: pytest.MonkeyPatch, restore_logging: object
) -> None:
    monkeypatch.delenv("MARS_DEBUG", raising=False)
    logging.getLogger("mars.timing").setLevel(logging.NOTSET)
    logs.setup(0)
    assert not logging.getLogger("mars.timing").isEnabledFor(logging.DEBUG)


def test_records_go_to_the_stderr_of_the_moment_not_a_closed_one(
    monkeypatch: pytest.MonkeyPatch, restore_logging: object
) -> None:
    """`setup` ran while something had swapped stderr (a test capturing output); that stream
    is later closed and another put in its place: records go to the new one, no error."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.setup(0)
    logging.getLogger("mars.test").warning("one")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("mars.test").warning("two")
    assert 'msg="two"' in second.getvalue()
    assert "Logging error" not in second.getvalue()
