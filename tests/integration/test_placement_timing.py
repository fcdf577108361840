"""Each placement's steps are timed and logged on `mars.timing` (what
`benchmarks.placement_latency` breaks the reply's latency down with)."""

from __future__ import annotations

import logging
import re

import pytest

from tests.integration.test_stall import chain, one_agent, run_to_end

pytestmark = pytest.mark.integration


async def test_a_placement_logs_the_time_of_each_step(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with one_agent(nats_url) as (orch, _, _lost):
        with caplog.at_level(logging.DEBUG, logger="mars.timing"):
            run = await run_to_end(orch, chain("t", "u"))
    lines = [r.getMessage() for r in caplog.records if r.name == "mars.timing"]
    assert len(lines) == 1 and lines[0].startswith("placed p ")
    ms = {k: float(v) for k, v in re.findall(r"(\w+)_ms=([0-9.]+)", lines[0])}
    steps = ("claim", "plan", "send", "book", "offer")
    assert set(ms) == {*steps, "total", "budget", "held"}
    assert ms.pop("budget") == pytest.approx(1e3 * orch.plan_budget_s)  # alone: all of it
    assert ms.pop("held") < 20.0  # not behind on task events: no wait (a preemption at most)
    assert all(ms[k] > 0.0 for k in steps)  # a first placement: offers sent, then booked
    assert sum(ms[k] for k in steps) <= ms["total"]
    assert "conflicts=0 rejections=0" in lines[0]
    assert run.step_s["offer"] * 1e3 == pytest.approx(ms["offer"], abs=1e-3)
