"""An output held in memory while it is sent (`put(hold=True)`): past the memory bound until
`fit_memory`, which spills the newest outputs in memory, delivered ones too, until the rest
fit; an offline agent's output still goes to disk at once."""

from __future__ import annotations

from pathlib import Path

from edge_agent.retention import OutputStore


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0  # every output newer than the one before
        return self.t


def _store(tmp_path: Path) -> OutputStore:
    return OutputStore(tmp_path / "out", memory_bytes=100, max_bytes=1000, clock=Clock())


def test_a_held_output_stays_in_memory_past_the_bound_until_fitted(tmp_path: Path) -> None:
    store = _store(tmp_path)
    small, _ = store.put("p", "a", 1, b"a" * 60, {"c": "x"})
    big, _ = store.put("p", "b", 1, b"b" * 200, {"c": "x"}, hold=True)
    assert small is not None and big is not None
    assert big.data is not None and big.path is None and store.memory == 260
    assert store.read(big) == b"b" * 200
    store.fit_memory()  # the newest goes to disk; the older one fits
    assert big.data is None and big.path is not None and store.read(big) == b"b" * 200
    assert small.data is not None and store.memory == 60


def test_without_hold_an_output_past_the_bound_is_spilled_at_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    entry, _ = store.put("p", "b", 1, b"b" * 200, {"c": "x"})
    assert entry is not None and entry.data is None and entry.path is not None
    offline, _ = store.put("p", "o", 1, b"o" * 10, {"c": "x"}, spill=True, hold=True)
    assert offline is not None and offline.path is not None  # must survive a crash


def test_fitting_spills_a_delivered_output_rather_than_dropping_it(tmp_path: Path) -> None:
    """Every consumer acknowledged it while it was held: it is still kept a while for a
    consumer placed again, on disk."""
    store = _store(tmp_path)
    entry, _ = store.put("p", "b", 1, b"b" * 200, {"c": "x"}, hold=True)
    assert entry is not None and store.ack("p", "b", "c") is entry
    store.fit_memory()
    assert store.get("p", "b") is entry and entry.path is not None and store.memory == 0
    reloaded = OutputStore(tmp_path / "out", memory_bytes=100, max_bytes=1000)
    assert reloaded.get("p", "b") is not None  # and found again after a restart


def test_fitting_memory_within_the_bound_changes_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    entry, _ = store.put("p", "a", 1, b"a" * 100, {"c": "x"}, hold=True)
    store.fit_memory()
    assert entry is not None and entry.data is not None and entry.path is None
