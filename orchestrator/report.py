"""Plain-text tables of plans and timelines for people."""

from __future__ import annotations

from schemas.api import StatusReply, SubmitReply


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
        rows.append(f"predicted vs ran: mean error {st.prediction_error_pct:.1f}%")
    return "\n".join(rows)
