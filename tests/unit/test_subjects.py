"""Reading a pipeline id back from a task event's subject (orchestrator's live event path)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas import subjects

ids = st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True)


@given(pid=ids, tid=ids)
def test_the_pipeline_of_a_task_event_subject_is_the_one_it_was_made_with(
    pid: str, tid: str
) -> None:
    assert subjects.pipeline_of_task_event(subjects.task_event(pid, tid)) == pid


def test_other_subjects_name_no_pipeline() -> None:
    for subject in (
        subjects.pipeline_event("p"),  # not a task event
        f"{subjects.EVENTS}.task.p",  # no task
        f"{subjects.EVENTS}.task.p.t.x",  # one token too many
        f"{subjects.EVENTS}.task..t",  # empty pipeline
        "mars.v2.events.task.p.t",
    ):
        assert subjects.pipeline_of_task_event(subject) is None, subject
