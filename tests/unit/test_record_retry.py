"""A pipeline record whose write keeps losing its CAS is tried again later and said, never
dropped in silence (`orchestrator.reliability.failover`). Stand-ins for the KV stores: this is
about the bookkeeping around them (the stores themselves are tested over a real nats-server)."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

import pytest
from nats.js.errors import KeyWrongLastSequenceError

from orchestrator.reliability.failover import RECORD_CAS_TRIES, Failover
from orchestrator.state.pipelines import PipelineRun
from schemas import PipelineSpec


class _Orch:
    owner = "orch-test"
    keep_s = 24 * 3600.0

    def __init__(self) -> None:
        self.spawned: list[Coroutine[Any, Any, Any]] = []

    def mono(self) -> float:
        return 10.0

    def wall(self) -> float:
        return 1e9

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.spawned.append(coro)


class _Leases:
    def may_act(self, pid: str) -> bool:
        return True

    def epoch(self, pid: str) -> int:
        return 1


class _Runs:
    """Every record write loses its CAS (someone writes the key each time in between)."""

    def __init__(self) -> None:
        self.writes = 0

    async def save_spec(self, pid: str, spec: PipelineSpec) -> None:
        return None

    async def write(self, fields: dict[str, Any], last: int | None) -> int:
        self.writes += 1
        raise KeyWrongLastSequenceError()

    async def record(self, pid: str) -> None:
        return None


async def test_a_record_that_keeps_losing_its_cas_is_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    orch, runs = _Orch(), _Runs()
    failover = Failover(orch)  # type: ignore[arg-type]
    failover.leases, failover.runs = _Leases(), runs  # type: ignore[assignment]
    spec = PipelineSpec.model_validate(
        {"name": "r", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.01}}]}
    )
    with caplog.at_level(logging.WARNING, logger="mars.failover"):
        await failover.persist(PipelineRun("p", spec, 0.0))
    assert runs.writes == RECORD_CAS_TRIES
    assert any("persisting p failed (will retry)" in r.getMessage() for r in caplog.records)
    assert len(orch.spawned) == 1  # the later attempt, scheduled
    assert failover.record_writes == 0
    for coro in orch.spawned:
        coro.close()
