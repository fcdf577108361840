"""Reading pipelines and senders back from subjects (the orchestrator's event paths, the
agents' data plane)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas import subjects

ids = st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True)


@given(pid=ids, tid=ids, aid=ids)
def test_a_task_event_subject_names_its_pipeline_and_its_agent(
    pid: str, tid: str, aid: str
) -> None:
    subject = subjects.task_event(pid, tid, aid)
    assert subjects.pipeline_of_task_event(subject) == pid
    assert subjects.agent_of_task_event(subject) == aid


def test_the_older_task_event_subject_names_a_pipeline_and_no_agent() -> None:
    """What agents of wire level 4 and older publish: `…task.<pipeline>.<task>`."""
    old = f"{subjects.EVENTS}.task.p.t"
    assert subjects.pipeline_of_task_event(old) == "p"
    assert subjects.agent_of_task_event(old) is None


def test_other_subjects_name_no_pipeline() -> None:
    for subject in (
        subjects.pipeline_event("p"),  # not a task event
        f"{subjects.EVENTS}.task.p",  # no task
        f"{subjects.EVENTS}.task.p.t.a.x",  # one token too many
        f"{subjects.EVENTS}.task..t",  # empty pipeline
        f"{subjects.EVENTS}.task.p.t.",  # empty agent
        "mars.v2.events.task.p.t.a",
    ):
        assert subjects.pipeline_of_task_event(subject) is None, subject
        assert subjects.agent_of_task_event(subject) is None, subject


def test_every_task_event_of_a_pipeline_is_under_its_wildcards() -> None:
    assert subjects.task_events_of("p") == f"{subjects.EVENTS}.task.p.>"
    assert f"{subjects.EVENTS}.task.>" == subjects.ALL_TASK_EVENTS
    assert subjects.task_event("p", "t", "a").startswith(subjects.task_events_of("p")[:-1])


@given(pid=ids, aid=ids)
def test_an_input_gone_subject_names_its_pipeline_and_its_sender(pid: str, aid: str) -> None:
    assert subjects.input_gone_parts(subjects.input_gone(pid, aid)) == (pid, aid)


def test_input_gone_subjects_of_the_older_form_and_others() -> None:
    assert subjects.input_gone_parts(f"{subjects.EVENTS}.input_gone.p") == ("p", None)
    for other in (
        f"{subjects.EVENTS}.input_gone.p.a.x",
        f"{subjects.EVENTS}.input_gone.p.",
        f"{subjects.EVENTS}.input_gone.",
        subjects.eviction("p"),
    ):
        assert subjects.input_gone_parts(other) is None, other


@given(to=ids, by=ids)
def test_a_push_and_an_ack_name_their_sender(to: str, by: str) -> None:
    assert subjects.sender_of(subjects.data_from(to, by)) == by
    assert subjects.sender_of(subjects.data_ack_from(to, by)) == by


def test_the_older_data_subjects_and_others_name_no_sender() -> None:
    for subject in (
        subjects.data("c"),
        subjects.data_ack("p"),
        subjects.fetch("p"),
        subjects.offer("p"),
        f"{subjects.PREFIX}.agents.c.data.from.a.x",
        f"{subjects.PREFIX}.agents.c.data.from.",
        f"{subjects.PREFIX}.agents.c.cmd.from.a",
        "mars.v2.agents.c.data.from.a",
    ):
        assert subjects.sender_of(subject) is None, subject


def test_a_consumers_subscriptions_take_every_sender_and_only_its_own() -> None:
    """The wildcards an agent subscribes: one token, the sender."""
    assert subjects.all_data_to("c") == f"{subjects.PREFIX}.agents.c.data.from.*"
    assert subjects.all_data_acks_to("p") == f"{subjects.PREFIX}.agents.p.data.ack.*"
