"""CPU of renewing and releasing on one device's booking key as it fills up.

    python -m benchmarks.booking_ops [--windows 10,100,1000] [--repeat 5]

A device's key holds one window per task booked on it. Every `LEASE_S / 3` (5 s) a replica
renews its live pipelines' windows on each key; a key's releases not written yet (the
windows of tasks that ended) are applied to it for every plan that reads it after it moved,
and at its next write. Each row: a key of `--windows` windows, one per pipeline and task
(the worst case: as many live pipelines as windows), renewed for every pipeline, and every
window released by its own exact release; each done in one pass over the windows (as the
orchestrator does it: `book.renew`, `book.release`) and one pipeline or release at a time
(the reference, `renew_one` / `release_one`), which must give the same key. Best of
`--repeat` runs, milliseconds, no NATS.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from benchmarks.common import counts, progress, table, timed
from orchestrator.reservations import book
from schemas.bookings import BookingWindow, DeviceBookings

NOW = 1e9


def full_key(n: int) -> DeviceBookings:
    return DeviceBookings(
        device="a:gpu0",
        windows=[
            BookingWindow(
                pipeline_id=f"p{i:05d}",
                task_id="t",
                slot=0,
                start=NOW + i,
                end=NOW + i + 1.0,
                expires=NOW + 15.0,
            )
            for i in range(n)
        ],
    )


def renew_one(b: DeviceBookings, pipeline_id: str, expires: float, now: float) -> DeviceBookings:
    """One pipeline's renewal over the whole key, as it was done for each pipeline."""
    windows = [
        w.model_copy(update={"expires": max(w.expires, expires)})
        if w.pipeline_id == pipeline_id else w
        for w in book.live(b.windows, now)
    ]  # fmt: skip
    return DeviceBookings(device=b.device, windows=windows)


def release_one(b: DeviceBookings, r: book.ReleaseArgs) -> DeviceBookings:
    """One release over the whole key, as it was done for each release."""
    pid, now, task_ids, exact = r
    drop = None if task_ids is None else set(task_ids)

    def mine(w: BookingWindow) -> bool:
        if w.pipeline_id != pid or (drop is not None and w.task_id not in drop):
            return False
        return exact is None or (w.task_id, w.start, w.end) in exact

    return DeviceBookings(
        device=b.device, windows=[w for w in book.live(b.windows, now) if not mine(w)]
    )


def one_by_one_renew(b: DeviceBookings, pids: list[str]) -> DeviceBookings:
    for pid in pids:
        b = renew_one(b, pid, NOW + 30.0, NOW)
    return b


def one_by_one_release(b: DeviceBookings, rels: list[book.ReleaseArgs]) -> DeviceBookings:
    for r in rels:
        b = release_one(b, r)
    return b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--windows", type=counts, default=[10, 100, 1000])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    rows = []
    for n in args.windows:
        progress(f"{n} windows")
        b = full_key(n)
        pids = [w.pipeline_id for w in b.windows]
        rels: list[book.ReleaseArgs] = [
            (w.pipeline_id, NOW, None, [(w.task_id, w.start, w.end)]) for w in b.windows
        ]

        def best(fn: Callable[[], DeviceBookings]) -> tuple[DeviceBookings, float]:
            return timed(fn, repeat=args.repeat)

        renewed, t_renew = best(lambda: book.renew(b, pids, NOW + 30.0, NOW))  # noqa: B023
        renewed_ref, t_renew_ref = best(lambda: one_by_one_renew(b, pids))  # noqa: B023
        released, t_rel = best(lambda: book.release(b, rels))  # noqa: B023
        released_ref, t_rel_ref = best(lambda: one_by_one_release(b, rels))  # noqa: B023
        if renewed != renewed_ref or released != released_ref or released.windows:
            raise SystemExit(f"{n} windows: one pass and one at a time differ")
        rows.append([
            n, t_renew_ref * 1e3, t_renew * 1e3, t_renew_ref / t_renew,
            t_rel_ref * 1e3, t_rel * 1e3, t_rel_ref / t_rel,
        ])  # fmt: skip
    print(table(rows, [
        "windows", "renew each ms", "renew all ms", "ratio",
        "release each ms", "release all ms", "ratio",
    ]))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
