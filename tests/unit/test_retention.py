"""Retained outputs, payload checks, the transfer schema and reconnect backoff (pure parts)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_agent import retention
from edge_agent.dataplane import check_payload, object_key
from edge_agent.outbox import backoff_delay, reconnect_handler
from edge_agent.retention import OutputStore
from schemas.codec import decode, encode
from schemas.placement import DataTransfer

SHA = hashlib.sha256(b"payload").hexdigest()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _store(tmp_path: Path, **kw: float) -> tuple[OutputStore, Clock]:
    clock = Clock()
    opts: dict[str, float] = {"memory_bytes": 100, "max_bytes": 1000, "max_age_s": 60.0, **kw}
    store = OutputStore(
        tmp_path / "out",
        memory_bytes=int(opts["memory_bytes"]),
        max_bytes=int(opts["max_bytes"]),
        max_age_s=opts["max_age_s"],
        clock=clock,
    )
    return store, clock


def test_kept_until_every_consumer_acked(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    entry, dropped = store.put("p", "src", 7, b"x" * 10, {"a": "agent-1", "b": "agent-2"})
    assert entry is not None and not dropped
    assert store.ack("p", "src", "a", token=6) is None  # another placement's receipt
    assert store.ack("p", "src", "a", token=7) is None
    assert store.get("p", "src") is entry
    assert store.ack("p", "src", "b") is entry  # the last one: waited on no more
    assert len(store) == 0 and store.get("p", "src") is entry  # kept a while, delivered


def test_a_delivered_output_is_kept_a_while_for_a_consumer_placed_again(tmp_path: Path) -> None:
    """A consumer's job may acknowledge an output and be withdrawn just after (a re-plan
    moved it): its next placement fetches the output instead of the producer running again."""
    store, clock = _store(tmp_path)
    entry, _ = store.put("p", "src", 7, b"x" * 10, {"c": "agent-1"})
    assert store.ack("p", "src", "c") is entry
    store.route("p", "src", "c", "agent-2")  # the moved consumer asks for it
    assert store.entries[("p", "src")] is entry and entry.unacked() == {"c": "agent-2"}
    store.ack("p", "src", "c")
    clock.t += retention.DELIVERED_KEEP_S + 1
    store.expire()
    assert store.get("p", "src") is None and store.bytes == 0 and store.memory == 0


def test_delivered_outputs_go_first_for_room_and_are_bounded(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, memory_bytes=100, max_bytes=1000)
    store.put("p", "done", 1, b"d" * 60, {"c": "x"})
    store.ack("p", "done", "c")
    live, _ = store.put("p", "live", 1, b"l" * 60, {"c": "x"})  # memory: the delivered goes
    assert live is not None and live.data is not None and store.get("p", "done") is None
    assert store.memory == 60 and store.bytes == 60
    for i in range(retention.DELIVERED_KEPT + 5):
        store.put("q", f"t{i}", 1, b"", {"c": "x"})
        store.ack("q", f"t{i}", "c")
    assert len(store.delivered) == retention.DELIVERED_KEPT


def test_a_new_route_needs_a_new_receipt(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    store.put("p", "src", 1, b"x", {"c": "old"})
    store.ack("p", "src", "c")  # released
    entry, _ = store.put("p", "src", 1, b"x", {"c": "old", "d": "z"})
    assert entry is not None
    store.ack("p", "src", "c")
    store.route("p", "src", "c", "new")  # c was re-placed: it must confirm again
    assert entry.unacked() == {"c": "new", "d": "z"}


def test_no_consumers_nothing_kept(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    assert store.put("p", "sink", 1, b"x", {}) == (None, [])


def test_cancel_and_age_release(tmp_path: Path) -> None:
    store, clock = _store(tmp_path)
    store.put("p", "a", 1, b"1", {"c": "x"})
    store.put("p", "b", 1, b"2", {"c": "x"})
    store.put("q", "a", 1, b"3", {"c": "x"})
    assert [e.producer for e in store.drop_pipeline("p", ["a"])] == ["a"]
    assert [e.key for e in store.drop_pipeline("p")] == [("p", "b")]
    clock.t += 61
    store.put("r", "a", 1, b"4", {"c": "x"})
    assert [e.key for e in store.expire()] == [("q", "a")]
    assert list(store.entries) == [("r", "a")]


def test_memory_spills_to_disk_and_total_is_bounded(tmp_path: Path) -> None:
    store, clock = _store(tmp_path, memory_bytes=100, max_bytes=1000)
    small, _ = store.put("p", "s", 1, b"s" * 60, {"c": "x"})
    big, _ = store.put("p", "b", 1, b"b" * 400, {"c": "x"})
    assert small is not None and small.data is not None  # in memory
    assert big is not None and big.data is None and big.path is not None  # spilled
    assert store.read(big) == b"b" * 400 and store.memory == 60
    clock.t += 1
    big2, dropped = store.put("p", "b2", 1, b"c" * 600, {"c": "x"})
    assert big2 is not None and [e.producer for e in dropped] == ["s"]  # the oldest went
    assert store.bytes <= 1000
    too_big, _ = store.put("p", "huge", 1, b"h" * 1001, {"c": "x"})
    assert too_big is None


def test_spilled_outputs_survive_a_restart(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    entry, _ = store.put("p", "src", 3, b"keep me", {"a": "n1", "b": "n2"})
    assert entry is not None
    store.ack("p", "src", "a")
    store.put("p", "other", 1, b"gone", {"a": "n1"})
    store.drop_pipeline("p", ["other"])
    store.spill_all()
    again, _ = _store(tmp_path)
    got = again.get("p", "src")
    assert got is not None and again.read(got) == b"keep me"
    assert got.token == 3 and got.unacked() == {"b": "n2"} and got.sha256 == entry.sha256
    assert list(again.entries) == [("p", "src")]


def test_the_media_type_an_output_was_made_as_survives_a_restart(tmp_path: Path) -> None:
    """Sent with the output to a consumer that fetches it after the agent restarted; a type
    this release does not know (a sidecar of a newer one) is taken as not said."""
    store, _ = _store(tmp_path)
    store.put("p", "doc", 1, b'{"n":3}', {"c": "n1"}, media_type="application/json")
    store.put("p", "raw", 1, b"raw", {"c": "n1"})
    store.put("p", "odd", 1, b"odd", {"c": "n1"}, media_type="text/plain")
    store.spill_all()
    odd = store.get("p", "odd")
    assert odd is not None and odd.path is not None
    meta = odd.path.with_suffix(".json")
    meta.write_text(meta.read_text().replace("text/plain", "image/png"))
    again, _ = _store(tmp_path)
    types = {p: e.media_type for (_, p), e in again.entries.items()}
    assert types == {"doc": "application/json", "raw": None, "odd": None}


def test_payload_check_names_the_problem() -> None:
    assert check_payload(b"payload", SHA) is None
    assert check_payload(b"payload", SHA, 7) is None
    bad = check_payload(b"tampered", SHA)
    assert bad is not None and bad.startswith("sha256 mismatch")
    short = check_payload(b"pay", SHA, 7)
    assert short is not None and "size" in short


def test_transfer_carries_exactly_one_payload() -> None:
    base = {"pipeline_id": "p", "producer": "a", "consumer": "b", "token": 1, "sha256": SHA}
    inline = DataTransfer(**base, data=b"payload")  # type: ignore[arg-type]
    ref = DataTransfer(**base, object_key=object_key("p", "a", 1), size=3 << 20)  # type: ignore[arg-type]
    assert inline.nbytes == 7 and ref.nbytes == 3 << 20
    for m in (inline, ref):
        assert decode(encode(m), DataTransfer) == m
    with pytest.raises(ValidationError, match="exactly one"):
        DataTransfer(**base)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="exactly one"):
        DataTransfer(**base, data=b"x", object_key="p/a/1", size=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="need size"):
        DataTransfer(**base, object_key="p/a/1")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        DataTransfer(**base, object_key="../etc/passwd", size=1)  # type: ignore[arg-type]
    # a message from before object transfers existed is still valid
    old = encode(inline)
    assert decode(old, DataTransfer).object_key is None


def test_reconnect_backoff_doubles_with_jitter_and_a_cap() -> None:
    rng = random.Random(1)
    for attempt in range(12):
        full = min(8.0, 0.25 * 2**attempt)
        draws = [backoff_delay(attempt, 0.25, 8.0, rng) for _ in range(50)]
        assert all(full / 2 <= d <= full for d in draws)
        assert len(set(draws)) > 40  # agents that lost the same server spread out
    pick = reconnect_handler(0.25, 8.0, random.Random(2))

    class S:
        def __init__(self, n: int) -> None:
            self.reconnects = n

    servers = [S(3), S(1), S(2)]
    chosen, delay = pick(servers, {})
    assert chosen is servers[1] and 0.25 <= delay <= 0.5
