"""A renewal over many live pipelines gives the event loop turns while it finds their keys,
and renews every live pipeline it finds, one write per key. No NATS: an orchestrator that was
never started, its live pipelines made by hand, its booking store a recorder."""

from __future__ import annotations

import asyncio

from benchmarks.watchdog_look import Renewals, held, idle_orchestrator
from orchestrator import service


async def test_a_renewal_finds_every_live_pipeline_giving_the_loop_turns() -> None:
    o, _ = idle_orchestrator(300)  # 6,000 placements, all on one device
    store = Renewals()
    o.store = store  # type: ignore[assignment]
    o.pipelines["p0"].finish("succeeded", "", 0.0)

    async def end_the_last() -> None:  # at the renewal's first pause
        o.pipelines["p299"].finish("cancelled", "by its submitter", 0.0)

    async def renew_with_an_end() -> None:
        ender = asyncio.create_task(end_the_last())
        await o.renew_all()
        await ender

    renewal = await held(renew_with_an_end)
    assert renewal.turns >= 300 * 20 // service.RENEW_SLICE_TASKS
    assert store.calls == [("dev.a.cpu0", {f"p{k}" for k in range(1, 299)})]
