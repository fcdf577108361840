"""Booking rules for one device's windows. Pure: the KV store applies them under CAS.

A window occupies one slot of one device from `start` to `end`. Two windows on the same slot
may not overlap. Expired windows (a dead orchestrator stopped renewing them) are dropped by
whoever writes the key next. A new window may evict an overlapping one only if the caller's
`may_evict` says so (priority and preemption policy live with the caller).
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from schemas.bookings import BookingWindow, DeviceBookings

EPS = 1e-6
#: Priority points a waiting pipeline gains per second (aging against starvation).
AGING_PER_S = 1.0
#: Priority points a task's window gains for each earlier window of it an eviction took.
#: Aging alone lets a steady stream of higher-priority work take a low-priority task's window
#: again and again (priority 10 under priority-500 work: for 490 s); with this, work `gap`
#: points above a task evicts it at most ceil(gap / EVICTION_POINTS) times.
EVICTION_POINTS = 100.0

#: A window as plain values, for loops that visit every booked window on every plan:
#: (slot, start, end, expires, pipeline, preemptible, priority, submitted, evictions, task).
Row = tuple[int, float, float, float, str, bool, int, float, int, str]


def effective_priority(priority: int, submitted: float, now: float, evictions: int = 0) -> float:
    return priority + AGING_PER_S * max(0.0, now - submitted) + EVICTION_POINTS * evictions


def rows(book: DeviceBookings) -> tuple[Row, ...]:
    return tuple(
        (
            w.slot, w.start, w.end, w.expires, w.pipeline_id, w.preemptible, w.priority,
            w.submitted, w.evictions, w.task_id,
        )
        for w in book.windows
    )  # fmt: skip


@dataclass(frozen=True)
class Blocking:
    """Which booked windows a plan must work around at `now`: every live one except its own
    pipeline's (`pipeline_id`, replaced when it books again) and those it may evict:
    preemptible ones of lower effective priority than `eff` (None: it evicts nothing).
    `kept`: the pipeline's own tasks this plan does not place (fixed where they are): their
    windows stay and are in the way, as the write finds them (`add` replaces only the
    windows of the tasks it books or moves)."""

    pipeline_id: str | None = None
    eff: float | None = None
    now: float = 0.0
    kept: frozenset[str] = frozenset()

    def evictable(self, w: BookingWindow) -> bool:
        return self.evicts(w.preemptible, w.priority, w.submitted, w.evictions)

    def evicts(self, preemptible: bool, priority: int, submitted: float, evictions: int) -> bool:
        return (
            self.eff is not None
            and preemptible
            and effective_priority(priority, submitted, self.now, evictions) < self.eff
        )

    def __call__(self, w: BookingWindow) -> bool:
        """Whether `w` is in the way."""
        mine = w.pipeline_id == self.pipeline_id and w.task_id not in self.kept
        return not mine and not self.evictable(w)


def overlaps(a: BookingWindow, b: BookingWindow) -> bool:
    return a.slot == b.slot and a.start < b.end - EPS and b.start < a.end - EPS


def live(windows: Iterable[BookingWindow], now: float) -> list[BookingWindow]:
    return [w for w in windows if w.expires > now]


@dataclass
class AddResult:
    ok: bool
    book: DeviceBookings
    conflicts: list[BookingWindow] = field(default_factory=list)
    evicted: list[BookingWindow] = field(default_factory=list)
    expired: int = 0


def add(
    book: DeviceBookings,
    new: Sequence[BookingWindow],
    now: float,
    may_evict: Callable[[BookingWindow], bool] = lambda _w: False,
    moving: Collection[tuple[str, str]] = (),
) -> AddResult:
    """Book `new` on top of `book`; replaces earlier windows of the same (pipeline, task),
    and drops those of `moving` (tasks of the booking pipeline placed again in the same
    round, wherever they go: their old windows here are not in its plan's way)."""
    keys = {(w.pipeline_id, w.task_id) for w in new} | set(moving)
    current = live(book.windows, now)
    expired = len(book.windows) - len(current)
    kept = [w for w in current if (w.pipeline_id, w.task_id) not in keys]
    conflicts: list[BookingWindow] = []
    evicted: list[BookingWindow] = []
    reach = _reach(new)
    for w in kept:
        if _meets(reach.get(w.slot), w):
            (evicted if may_evict(w) else conflicts).append(w)
    if conflicts:
        return AddResult(False, book, conflicts=conflicts, expired=expired)
    gone = {(w.pipeline_id, w.task_id) for w in evicted}
    windows = [w for w in kept if (w.pipeline_id, w.task_id) not in gone] + list(new)
    windows.sort(key=lambda w: (w.slot, w.start, w.pipeline_id, w.task_id))
    return AddResult(
        True, DeviceBookings(device=book.device, windows=windows), evicted=evicted, expired=expired
    )


#: Per slot, the starts of a booking's windows in order, and for each the furthest any of them
#: up to it reaches (its `end - EPS`).
Reach = tuple[list[float], list[float]]


def _reach(new: Sequence[BookingWindow]) -> dict[int, Reach]:
    """`new` per slot, in order of start, refusing two of them that overlap: sorted once, so
    that a booking of thousands of windows (a pipeline of the most tasks a spec holds, on a
    device or two) costs a sort and a look-up per window booked there, not a look at every
    pair (3 million per key for 5,000 tasks on two devices: ~1.3 s, the event loop held)."""
    by_slot: dict[int, list[BookingWindow]] = {}
    for n in new:
        by_slot.setdefault(n.slot, []).append(n)
    out: dict[int, Reach] = {}
    for slot, ws in by_slot.items():
        ws.sort(key=lambda n: n.start)
        starts = [n.start for n in ws]
        reach: list[float] = []
        far, farthest = -math.inf, ws[0]  # (its end - EPS): how far the ones before reach
        for b in ws:
            # the first window to overlap an earlier one overlaps the farthest-reaching of
            # them (any other it overlaps would overlap that one too, and be found first)
            if far > b.start and farthest.start < b.end - EPS:
                raise ValueError(
                    f"windows of {farthest.task_id} and {b.task_id} overlap on slot {slot}"
                )
            if b.end - EPS > far:
                far, farthest = b.end - EPS, b
            reach.append(far)
        out[slot] = (starts, reach)
    return out


def _meets(reach: Reach | None, w: BookingWindow) -> bool:
    """Whether `w` overlaps one of a slot's new windows (`overlaps` one of them)."""
    if reach is None:
        return False
    starts, far = reach
    k = bisect_left(starts, w.end - EPS)  # those starting before w ends
    return k > 0 and far[k - 1] > w.start


#: One release: (pipeline, now, task_ids or None, exact (task, start, end) or None): the
#: pipeline's windows (only those of `task_ids`, or only those booked as `exact`: a task
#: booked again since keeps its new window), and whatever expired by `now`.
ReleaseArgs = tuple[str, float, Collection[str] | None, Collection[tuple[str, float, float]] | None]


def release(book: DeviceBookings, releases: Sequence[ReleaseArgs]) -> DeviceBookings:
    """Without what each of `releases` gives back, in one pass over the windows: a key that
    collects hundreds of releases (a busy device, its tasks ending between two of its writes)
    is not walked once per release."""
    if not releases:
        return book
    whole: set[str] = set()
    tasks: set[tuple[str, str]] = set()
    booked: set[tuple[str, str, float, float]] = set()
    now = max(r[1] for r in releases)  # each release drops what expired by its `now`
    for pid, _at, task_ids, exact in releases:
        if exact is not None:
            keep = None if task_ids is None else set(task_ids)
            booked.update((pid, t, s, e) for t, s, e in exact if keep is None or t in keep)
        elif task_ids is not None:
            tasks.update((pid, t) for t in task_ids)
        else:
            whole.add(pid)
    windows = [
        w for w in live(book.windows, now)
        if w.pipeline_id not in whole
        and (w.pipeline_id, w.task_id) not in tasks
        and (w.pipeline_id, w.task_id, w.start, w.end) not in booked
    ]  # fmt: skip
    return DeviceBookings(device=book.device, windows=windows)


def renew(
    book: DeviceBookings, pipeline_ids: Collection[str], expires: float, now: float
) -> DeviceBookings:
    """The windows of `pipeline_ids` expiring no sooner than `expires`, in one pass (a key
    shared by many live pipelines is not walked once per pipeline); expired ones dropped."""
    if not pipeline_ids:
        return book
    pids = set(pipeline_ids)
    windows = [
        w.model_copy(update={"expires": max(w.expires, expires)})
        if w.pipeline_id in pids else w
        for w in live(book.windows, now)
    ]  # fmt: skip
    return DeviceBookings(device=book.device, windows=windows)


def hold(
    book: DeviceBookings, pipeline_id: str, task_id: str, start: float, end: float
) -> DeviceBookings:
    """The task's window (`start`..`end`) made non-preemptible: the task has started, and a
    started task is never stopped for a higher priority (its owner leaves it running), so a
    plan that took its time would wait for it. `book` itself when there is nothing to do."""

    def it(w: BookingWindow) -> bool:
        return (
            w.preemptible and w.pipeline_id == pipeline_id and w.task_id == task_id
            and abs(w.start - start) <= EPS and abs(w.end - end) <= EPS
        )  # fmt: skip

    if not any(it(w) for w in book.windows):
        return book
    windows = [w.model_copy(update={"preemptible": False}) if it(w) else w for w in book.windows]
    return DeviceBookings(device=book.device, windows=windows)


def double_booked(windows: Sequence[BookingWindow], now: float | None = None) -> list[str]:
    """Pairs of live windows overlapping on one slot (the invariant every revision must keep)."""
    ws = list(windows) if now is None else live(windows, now)
    out = []
    by_slot: dict[int, list[BookingWindow]] = {}
    for w in ws:
        by_slot.setdefault(w.slot, []).append(w)
    for slot, lst in by_slot.items():
        lst.sort(key=lambda w: w.start)
        for a, b in itertools.pairwise(lst):
            if b.start < a.end - EPS:
                out.append(
                    f"slot {slot}: {a.pipeline_id}/{a.task_id} [{a.start:.3f},{a.end:.3f}]"
                    f" overlaps {b.pipeline_id}/{b.task_id} [{b.start:.3f},{b.end:.3f}]"
                )
    return out
