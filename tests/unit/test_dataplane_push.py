"""A push that starts after its output stopped being retained ships nothing and fails
nothing (it once raised an AssertionError reading the freed bytes, logged as a failure)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edge_agent.config import AgentConfig
from edge_agent.core import AgentCore
from edge_agent.dataplane import DataPlane


async def test_a_push_of_an_output_no_longer_retained_does_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = AgentConfig.model_validate({"site": "s", "tier": "edge", "probe_cpu": False})
    plane = DataPlane(
        "a1", AgentCore("a1", "i1", [], ["synthetic"]), config, tmp_path,
        on_input=lambda: None, spawn=asyncio.create_task,
    )  # fmt: skip
    local = {"t1": "a1"}  # the consumer runs here: delivered from the retained bytes
    entry, _ = plane.store.put("p", "t0", 1, b"x" * 100, local)
    assert entry is not None
    _, dropped = plane.store.put("p", "t0", 2, b"y" * 100, local)  # a re-run replaced it
    assert dropped == [entry] and entry.data is None and entry.path is None
    await plane.push_all(entry)  # scheduled before the re-run replaced it
    assert not [r for r in caplog.records if "failed" in r.getMessage()]
    assert plane.stats["inputs"] == 0 and not plane._pushing
