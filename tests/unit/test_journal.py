"""The agent's on-disk event journal: append/replay/compact, crash safety, bound, dedupe."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_agent.journal import TRUNCATE_AT, Journal, JournalFull


def _keys(j: Journal) -> list[str]:
    return [e.key for e in j.pending()]


def test_append_replay_in_order_and_done_entries_never_come_back(tmp_path: Path) -> None:
    path = tmp_path / "j" / "events.journal"
    j = Journal(path, 1 << 20)
    for i in range(5):
        assert j.append(f"ev-{i}", "mars.v1.events.task.p.t", bytes([i]) * 10) is not None
    seqs = [e.seq for e in j.pending()]
    j.mark_done(seqs[:2])
    j.close()
    again = Journal(path, 1 << 20)
    assert _keys(again) == ["ev-2", "ev-3", "ev-4"]
    assert [e.data for e in again.pending()] == [bytes([i]) * 10 for i in (2, 3, 4)]
    assert again.pending()[0].topic == "mars.v1.events.task.p.t"
    # sequence numbers continue after a restart
    e = again.append("ev-5", "t", b"")
    assert e is not None and e.seq > seqs[-1]
    again.mark_done(x.seq for x in again.pending())
    assert len(again) == 0 and path.stat().st_size == again.size > 0  # a done record
    again.close()
    assert Journal(path, 1 << 20).pending() == []


def test_a_journal_with_nothing_left_is_emptied_once_past_its_size(tmp_path: Path) -> None:
    """All delivered: a done record is appended while the file is small (cheaper than
    emptying it each time), and the file is emptied once it would pass TRUNCATE_AT."""
    path = tmp_path / "e.journal"
    j = Journal(path, 1 << 20)
    sizes = []
    for i in range(2000):
        e = j.append(f"ev-{i}", "mars.v1.events.task.p.t", b"x" * 100)
        assert e is not None
        j.mark_done([e.seq])
        sizes.append(path.stat().st_size)
        assert sizes[-1] == j.size <= TRUNCATE_AT
    emptied = [i for i in range(1, len(sizes)) if sizes[i] == 0]
    assert emptied, "never emptied"
    assert all(sizes[i - 1] > TRUNCATE_AT // 2 for i in emptied)  # only once it was big
    j.close()
    again = Journal(path, 1 << 20)
    assert again.pending() == [] and again.skipped == 0
    assert "ev-1999" in again  # the done records since the last emptying are remembered


def test_a_key_is_journaled_once(tmp_path: Path) -> None:
    j = Journal(tmp_path / "e.journal", 1 << 20)
    assert j.append("k1", "t", b"a") is not None
    assert j.append("k1", "t", b"b") is None  # pending: a duplicate
    j.mark_done([j.pending()[0].seq])
    assert j.append("k1", "t", b"c") is None  # delivered: still a duplicate
    assert "k1" in j and len(j) == 0


def test_a_torn_last_line_is_ignored_and_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "e.journal"
    j = Journal(path, 1 << 20)
    j.append("a", "t", b"1")
    j.append("b", "t", b"2")
    j.close()
    raw = path.read_bytes()
    path.write_bytes(raw[:-7])  # a crash in the middle of writing "b"
    again = Journal(path, 1 << 20)
    assert _keys(again) == ["a"] and again.skipped == 1
    again.append("c", "t", b"3")  # lands on a clean line, not glued to the torn one
    again.close()
    assert _keys(Journal(path, 1 << 20)) == ["a", "c"]


def test_a_corrupt_line_is_skipped_not_misread(tmp_path: Path) -> None:
    path = tmp_path / "e.journal"
    j = Journal(path, 1 << 20)
    for k in "abc":
        j.append(k, "t", k.encode() * 3)
    j.close()
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"YmJi", b"YmJj")  # one flipped byte in b's payload
    path.write_bytes(b"\n".join(lines))
    again = Journal(path, 1 << 20)
    assert _keys(again) == ["a", "c"] and again.skipped == 1


def test_bound_compacts_then_refuses(tmp_path: Path) -> None:
    path = tmp_path / "e.journal"
    j = Journal(path, 4096)
    blob = b"x" * 500
    n = 0
    with pytest.raises(JournalFull):
        while True:
            j.append(f"k{n}", "t", blob)
            n += 1
            assert path.stat().st_size <= 4096
    assert 3 <= n < 10
    # done entries make room again: compaction keeps only what is pending
    j.mark_done([e.seq for e in j.pending()[:-1]])
    assert j.append("more", "t", blob) is not None
    assert path.stat().st_size <= 4096
    assert _keys(j) == [f"k{n - 1}", "more"]


def test_one_writer_per_journal(tmp_path: Path) -> None:
    path = tmp_path / "e.journal"
    j = Journal(path, 1 << 20)
    with pytest.raises(RuntimeError, match="in use"):
        Journal(path, 1 << 20)
    j.close()
    Journal(path, 1 << 20).close()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 30), st.binary(max_size=300)),
        st.tuples(st.just("done"), st.integers(0, 5), st.just(b"")),
        st.tuples(st.just("reopen"), st.integers(0, 40), st.just(b"")),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, max_bytes=st.sampled_from([4096, 8192, 1 << 20]))
def test_journal_matches_a_model_through_crashes(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, bytes]], max_bytes: int
) -> None:
    """Whatever happens (appends, deliveries, restarts with a torn tail), the journal replays
    exactly the model's undelivered entries, in order, never past its bound."""
    path = tmp_path_factory.mktemp("j") / "events.journal"
    j = Journal(path, max_bytes)
    model: list[tuple[str, bytes]] = []  # pending, in order
    done: set[str] = set()  # delivered in this life: a re-append is refused
    maybe: set[str] = set()  # delivered in an earlier life: remembered or not
    for op, n, data in ops:
        if op == "append":
            key = f"k{n}"
            pending = {k for k, _ in model}
            try:
                got = j.append(key, "subj", data)
            except JournalFull:
                assert key not in pending | done
                continue
            if key in pending | done:
                assert got is None
            elif key not in maybe:
                assert got is not None
            if got is not None:
                model.append((key, data))
                maybe.discard(key)
        elif op == "done":
            delivered = j.pending()[:n]
            j.mark_done(e.seq for e in delivered)
            done |= {e.key for e in delivered}
            del model[: len(delivered)]
        else:
            j.close()
            raw = path.read_bytes() if path.exists() else b""
            if n % 10 == 0 and raw.endswith(b"\n") and model:
                # a crash while the last append was half written: that entry is lost
                cut = raw[:-1].rfind(b"\n") + 1
                tail = raw[cut:]
                if tail.split(b" ")[1:2] == [b"E"]:
                    path.write_bytes(raw[: cut + max(1, len(tail) // 2)])
                    model.pop()
            j = Journal(path, max_bytes)
            maybe |= done
            done = set()
        assert [(e.key, e.data) for e in j.pending()] == model
        assert (path.stat().st_size if path.exists() else 0) <= max_bytes
    j.close()
