"""Replica membership (`reliability/replicas.py`): who is taken to be up, from hellos."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.reliability.replicas import HELLO_EVERY_S, MISSED_HELLOS, Replicas
from orchestrator.service import Orchestrator
from schemas import subjects
from schemas.codec import encode
from schemas.failover import ReplicaHello


class Wire:
    """What the replica publishes, and a way to hand it hellos (no NATS: the membership rule
    alone is under test)."""

    is_connected = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.heard: list[Callable[[Any], Awaitable[None]]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))

    async def subscribe(self, subject: str, cb: Callable[[Any], Awaitable[None]]) -> None:
        assert subject == subjects.REPLICA_HELLO
        self.heard.append(cb)

    async def hear(self, msg: Any) -> None:
        """A hello on the replicas' subject, as the subscription hands it on."""
        for cb in self.heard:
            await cb(msg)


def raw(data: bytes) -> Any:
    return SimpleNamespace(data=data)


def hello(**kw: Any) -> Any:
    return raw(encode(ReplicaHello(**kw)))


async def test_a_replica_is_up_from_its_hello_until_goodbye_or_silence() -> None:
    now = [100.0]
    wire = Wire()
    r = Replicas("me", lambda: now[0])
    await r.start(wire)
    await wire.hear(hello(owner="b", answer=True))  # a newcomer: answered with ours
    await wire.hear(hello(owner="c"))
    await wire.hear(hello(owner="me"))  # our own, heard back
    assert r.up() == ["b", "c"]
    assert len(wire.sent) == 1  # only the newcomer was answered
    await wire.hear(hello(owner="c", leaving=True))
    assert r.up() == ["b"]
    now[0] += MISSED_HELLOS * HELLO_EVERY_S - 0.1
    assert r.up() == ["b"]
    now[0] += 0.2  # three hellos missed
    assert r.up() == []


async def test_a_malformed_hello_changes_nothing() -> None:
    r = Replicas("me", lambda: 0.0)
    wire = Wire()
    await r.start(wire)
    await wire.hear(raw(b"\x81\xa5owner\xc0"))
    await wire.hear(raw(b"not msgpack at all \xff"))
    assert r.up() == [] and wire.sent == []


@pytest.mark.parametrize("name", ["a.b", "a b", "x" * 129, "orch>"])
def test_a_replica_name_that_is_no_subject_token_is_refused(name: str) -> None:
    """A replica's name is a token of its own subjects (`mars.v1.orch.<name>.cancel`)."""
    with pytest.raises(ValueError, match="orchestrator name"):
        Orchestrator("nats://127.0.0.1:1", name=name)
