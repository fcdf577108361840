"""Shared fixtures: a real nats-server with JetStream on a free port in a temp dir; the
process's garbage collector put back as it was."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.infra.natsserver import EmbeddedNats

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
DATASETS = SHARED / "datasets"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile the numba scheduling loop once (or load it from the disk cache) before any test
    runs, so no timed test and no orchestrator subprocess pays the first compile."""
    from orchestrator.scheduling import compiled

    compiled.warm_up()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(store_dir=str(tmp_path / "nats"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def gc_state() -> Iterator[None]:
    """This process's garbage collector as it was (on or off, thresholds, hooks, nothing frozen),
    afterwards: for tests of what services do to it once up."""
    thresholds, hooks, enabled = gc.get_threshold(), list(gc.callbacks), gc.isenabled()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        gc.callbacks[:] = hooks
