"""How much planning time beyond HEFT a pipeline gets: more for larger pipelines.

The portfolio (`scheduling.portfolio`) runs HEFT, then other list schedulers while their
estimated cost fits its budget. A flat few milliseconds suits the common 10-50-task pipeline
(its candidates cost tens of microseconds each, so most fit) but gives a 1,000-task pipeline
nothing beyond HEFT, where the other candidates win most often and by the most. So the
operator's budget (`--plan-budget-ms`, default `PLAN_BUDGET_S`) is what a pipeline of up to
`BUDGET_TASKS` tasks gets, and larger ones get it times the square of their size over that
(the candidates' cost grows with the size, and so does what a better plan saves), up to
`BUDGET_CAP_S`. (In proportion to size alone, 50-200-task graphs got a quarter of what the
portfolio needs.) The portfolio still spends at most `PLAN_MAX_SHARE` of HEFT's makespan
beyond HEFT (planning time delays a new pipeline's end as much as a longer plan), and nothing
when HEFT's plan already ends at the critical-path bound.

So, from 2 ms: 20 tasks 2 ms, 50 tasks 12.5 ms, 100 tasks 50 ms (the portfolio's own
default), 224 tasks and more 250 ms; a budget of 0 means HEFT only, at every size.
"""

from __future__ import annotations

#: Pipelines up to this many tasks get the operator's budget as it is.
BUDGET_TASKS = 20
#: No pipeline gets more than this, whatever its size.
BUDGET_CAP_S = 0.25


def plan_budget(base_s: float, tasks: int) -> float:
    """Seconds beyond HEFT for planning a pipeline of `tasks` tasks, from the base budget."""
    if not base_s > 0:
        return 0.0
    scaled = base_s * max(1.0, tasks / BUDGET_TASKS) ** 2
    return min(scaled, max(base_s, BUDGET_CAP_S))
