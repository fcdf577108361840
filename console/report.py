"""Plain-text tables of plans and timelines for people."""

from __future__ import annotations

from typing import TYPE_CHECKING

from schemas.api import StatusReply, SubmitReply

if TYPE_CHECKING:
    from orchestrator.reservations.listing import KeyBookings


def plan_line(algorithm: str, makespan_s: float, cost: float) -> str:
    """A plan's headline: what made it, its predicted makespan and cost (dollars)."""
    return f"{algorithm}, predicted makespan {makespan_s:.3f} s, cost ${cost:.6g}"


def plan_table(reply: SubmitReply | StatusReply) -> str:
    rows = [f"{'task':<16} {'agent':<14} {'device':<8} {'start s':>8} {'finish s':>9}"]
    for p in reply.plan:
        rows.append(
            f"{p.task_id:<16} {p.agent_id:<14} {p.device_id:<8} {p.start_s:>8.3f} "
            f"{p.finish_s:>9.3f}"
        )
    return "\n".join(rows)


def timeline_table(st: StatusReply) -> str:
    rows = [
        f"{'task':<16} {'state':<10} {'agent':<14} {'device':<8} {'started':>8} {'finished':>9} "
        f"{'ran s':>7} {'predicted':>9}  result"
    ]

    def f(x: float | None, w: int) -> str:
        return f"{x:>{w}.3f}" if x is not None else f"{'-':>{w}}"

    for t in sorted(st.tasks, key=lambda t: (t.started_s is None, t.started_s or 0.0)):
        rows.append(
            f"{t.task_id:<16} {t.state:<10} {t.agent_id or '-':<14} {t.device_id or '-':<8} "
            f"{f(t.started_s, 8)} {f(t.finished_s, 9)} {f(t.duration_s, 7)} "
            f"{f(t.predicted_s, 9)}  {t.result or t.error}"
        )
    if st.prediction_error_pct is not None:
        rows.append(
            f"predicted vs ran: off by {st.prediction_error_pct:.1f}% of the run time "
            "(|predicted - ran| summed over the tasks that succeeded)"
        )
    kept = [t for t in st.tasks if t.output_key is not None]
    if kept:
        rows.append(f"outputs (mars get {st.pipeline_id} TASK -o FILE):")
        for t in kept:
            kind = t.output_type or "application/octet-stream"
            rows.append(
                f"  {t.task_id:<16} {t.output_bytes:>10} B  {kind:<26} sha256 {t.output_sha256}"
            )
    return "\n".join(rows)


def bookings_table(keys: list[KeyBookings], now: float) -> str:
    """Each device key and its windows, in time order; instants in seconds from `now` (the
    booking clock is the wall clock). An expired window stays until the key's next write."""
    if not keys:
        return "nothing booked"
    rows: list[str] = []
    for k in keys:
        rows.append(
            f"{k.key}  revision {k.revision}  {k.size} B  "
            f"{len(k.windows)} window{'' if len(k.windows) == 1 else 's'}"
            + (f"  ({k.problem})" if k.problem else "")
        )
        if not k.windows:
            continue
        rows.append(
            f"  {'slot':>4}  {'pipeline/task':<40} {'start s':>9} {'end s':>9} {'expires s':>10}"
            f" {'prio':>4}  {'preemptible':<18}  owner"
        )
        for w in sorted(k.windows, key=lambda w: (w.start, w.slot)):
            left = w.expires - now
            # how many earlier windows of the task evictions took (each ranks this one higher)
            pre = ("yes" if w.preemptible else "no") + (
                f", evicted {w.evictions}x" if w.evictions else ""
            )
            rows.append(
                f"  {w.slot:>4}  {w.pipeline_id + '/' + w.task_id:<40} {w.start - now:>+9.3f} "
                f"{w.end - now:>+9.3f} {'expired' if left <= 0 else f'{left:+.3f}':>10} "
                f"{w.priority:>4}  {pre:<18}  {w.owner}"
            )
    return "\n".join(rows)
