"""When the orchestrator's paced collector may run (`Orchestrator.idle`): never while a
submission waits to be served."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from orchestrator.service import Orchestrator


def test_a_waiting_submission_is_not_idle() -> None:
    async def run() -> None:
        orch = Orchestrator("nats://127.0.0.1:1")  # never started: no I/O
        assert orch.idle()
        orch.submissions.queue.put_nowait((0.0, cast(Any, object())))
        assert not orch.idle()
        orch.submissions.queue.get_nowait()
        assert orch.idle()

    asyncio.run(run())
