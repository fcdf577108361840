"""Windows being written are shown to planning until their writes are answered
(`BookingStore.hold`), on top of what the cache holds; each hold goes on its own."""

from __future__ import annotations

from orchestrator.reservations.store import BookingStore, Cached
from schemas.bookings import BookingWindow, DeviceBookings


def w(pipe: str, start: float, end: float) -> BookingWindow:
    return BookingWindow(pipeline_id=pipe, task_id="t", slot=0, start=start, end=end, expires=1e9)


def shown(store: BookingStore, key: str) -> list[str]:
    got = store.snapshot().get(key)
    return [] if got is None else [x.pipeline_id for x in got.book.windows]


def test_held_windows_are_shown_on_top_of_the_cache_until_each_hold_ends() -> None:
    store = BookingStore(js=None)
    store.cache["k"] = Cached(7, DeviceBookings(device="k", windows=[w("cached", 0, 1)]))
    end_a = store.hold({"k": [w("a", 1, 2)], "fresh": [w("a", 0, 1)]})
    end_b = store.hold({"k": [w("b", 2, 3)]})
    assert shown(store, "k") == ["cached", "a", "b"]
    assert store.snapshot()["k"].revision == 7  # the cached revision: CAS writes on it
    assert shown(store, "fresh") == ["a"]  # a key nobody wrote yet
    end_a()
    assert shown(store, "k") == ["cached", "b"]
    assert shown(store, "fresh") == []
    end_b()
    assert shown(store, "k") == ["cached"]
    assert store.snapshot()["k"] is store.cache["k"]  # nothing left on top
    assert store.cache["k"].book.windows == [w("cached", 0, 1)]  # the cache itself untouched
