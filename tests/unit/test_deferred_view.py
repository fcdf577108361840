"""What planning sees of a key with deferred releases is its cached value with every release
applied in the order they were made, however the view was kept up to date in between (one
more step on the last view, a pipeline's later release folding its earlier ones, a new
revision of the key arriving)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.reservations import book as rules
from orchestrator.reservations.store import Cached
from schemas.bookings import BookingWindow, DeviceBookings
from tests.unit.offline_store import offline_store

KEY = "dev.a.cpu0"
PIPELINES = ["p0", "p1", "p2"]
TASKS = ["t0", "t1", "t2"]


def windows() -> list[BookingWindow]:
    return [
        BookingWindow(
            pipeline_id=p,
            task_id=t,
            slot=0,
            start=10.0 * i + j,
            end=10.0 * i + j + 1,
            expires=1e9,
            owner="o",
        )
        for i, p in enumerate(PIPELINES)
        for j, t in enumerate(TASKS)
    ]


def applied(book: DeviceBookings, made: list[tuple[str, str | None]]) -> DeviceBookings:
    for pid, task in made:
        book = rules.release(book, [(pid, 0.0, [task] if task else None, None)])
    return book


release = st.tuples(
    st.sampled_from(PIPELINES),
    st.none() | st.sampled_from(TASKS),  # None: all of the pipeline's windows
)
step = st.one_of(
    st.tuples(st.just("defer"), release),
    st.tuples(st.just("look"), st.none()),
    st.tuples(st.just("new revision"), st.none()),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(step, max_size=20))
def test_the_planning_view_is_every_release_applied_in_order(
    steps: list[tuple[str, tuple[str, str | None] | None]],
) -> None:
    async def run() -> None:
        async with offline_store() as store:
            book = DeviceBookings(device=KEY, windows=windows())
            store.cache[KEY] = Cached(1, book)
            made: list[tuple[str, str | None]] = []
            for kind, arg in steps:
                if kind == "defer":
                    assert arg is not None
                    pid, task = arg
                    ws = [w for w in book.windows if w.pipeline_id == pid and w.task_id == task]
                    exact = [(w.task_id, w.start, w.end) for w in ws] if task else None
                    store.defer_release(KEY, pid, 0.0, exact=exact)
                    made.append(arg)
                elif kind == "new revision":  # the watch brings the same windows, newer
                    cur = store.cache[KEY]
                    store.cache[KEY] = Cached(cur.revision + 1, cur.book)
                else:
                    assert store.snapshot()[KEY].book == applied(book, made)
            assert store.snapshot()[KEY].book == applied(book, made)

    asyncio.run(run())
