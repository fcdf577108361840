"""The device of a booking key, and what `mars agents` shows of the windows booked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli import agent_line
from orchestrator.reservations.store import (
    device_key,
    device_key_of,
    device_of_key,
)
from schemas.api import AgentSummary, DeviceQueue

IDENT = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=1,
    max_size=40,
)


@given(IDENT, IDENT)
def test_a_keys_device_is_the_device_it_was_made_for(agent: str, dev: str) -> None:
    key = device_key(agent, dev)
    assert device_of_key(key) == f"{agent}:{dev}"
    assert device_key_of(device_of_key(key)) == key


def test_mars_agents_shows_the_windows_booked_and_a_full_device() -> None:
    a = AgentSummary(
        agent_id="edge-1", incarnation="i1", site="s1", tier="edge", alive=True,
        devices=["cpu0:cpu", "gpu0:gpu", "npu0:npu"], running=2,
        queues=[
            DeviceQueue(device_id="cpu0", windows=1500, key_bytes=262_000, full=True),
            DeviceQueue(device_id="gpu0", windows=3, key_bytes=600),
            DeviceQueue(device_id="npu0", windows=0, key_bytes=40),
        ],
    )  # fmt: skip
    line = agent_line(a)
    assert line.endswith(" booked=cpu0:1500(FULL, 255 KiB),gpu0:3")
    assert "running=2 devices=cpu0:cpu,gpu0:gpu,npu0:npu" in line
    assert "booked=" not in agent_line(a.model_copy(update={"queues": []}))
