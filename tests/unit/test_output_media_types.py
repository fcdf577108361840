"""What a producer's agent says its output is, and to which consumers' agents it says it
(pure parts; over a real nats-server in tests/integration/test_output_types.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from edge_agent import dataplane, values
from edge_agent.config import AgentConfig
from edge_agent.core import AgentCore
from edge_agent.dataplane import DataPlane
from edge_agent.executors import Output
from edge_agent.service import made_as
from schemas.pipeline import TaskSpec
from schemas.placement import ConsumerRef, TaskOffer


def test_an_output_is_said_to_be_what_its_spec_declares_else_what_was_made() -> None:
    doc = Output(b'{"n":3}', "", values.JSON)
    assert made_as(None, doc) == values.JSON
    assert made_as(values.BYTES, doc) == values.BYTES  # declared wins
    # raw bytes are said to be nothing: the consumer looks at them (a `.npy` an exec task
    # wrote is decoded as the array it holds)
    assert made_as(None, Output(values.npy(np.zeros(2)), "")) is None
    assert made_as(values.NPY, Output(b"", "")) == values.NPY


def _plane(tmp_path: Path) -> DataPlane:
    config = AgentConfig.model_validate({"site": "s", "tier": "edge", "probe_cpu": False})
    return DataPlane(
        "a1", AgentCore("a1", "i1", [], ["synthetic"]), config, tmp_path,
        on_input=lambda: None, spawn=asyncio.create_task,
    )  # fmt: skip


async def test_a_consumers_level_is_learned_from_offers_and_fetches(tmp_path: Path) -> None:
    plane = _plane(tmp_path)
    assert plane.level_of("b") == dataplane.UNKNOWN_LEVEL == 3  # sent no media type
    offer = TaskOffer(
        pipeline_id="p", agent_id="a1", incarnation="i1", device_id="cpu0", token=1,
        task=TaskSpec.model_validate({"id": "t", "run": {"kind": "synthetic"}}),
        consumers=[ConsumerRef(task_id="u", agent_id="b", wire=4),
                   ConsumerRef(task_id="v", agent_id="c", wire=1),
                   ConsumerRef(task_id="w", agent_id="d")],
    )  # fmt: skip
    entry = plane.keep(offer, b'{"n":3}', values.JSON)
    assert entry is not None and entry.media_type == values.JSON
    assert [plane.level_of(a) for a in "bcd"] == [4, 1, 3]
    plane.note_levels([ConsumerRef(task_id="u", agent_id="b")])  # an older orchestrator's
    assert plane.level_of("b") == 4  # not told: as heard before
    plane.note_level("b", 2)  # it asked with level 2 since (downgraded)
    assert plane.level_of("b") == 2
    for i in range(dataplane.LEVELS_KEPT):
        plane.note_level(f"x{i}", 4)
    assert plane.level_of("b") == 3 and len(plane._levels) == dataplane.LEVELS_KEPT
