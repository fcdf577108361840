"""Which agent a consumer's agent takes a pushed output from: the producer's, as its offer
names it, by the subject the push came on."""

from __future__ import annotations

from edge_agent.dataplane import producer_problem
from schemas.placement import InputRef
from schemas.wire import SENDER_SUBJECTS


def ref(wire: int) -> InputRef:
    return InputRef(task_id="src", agent_id="prod", wire=wire)


def test_a_push_named_by_the_producers_agent_is_taken() -> None:
    assert producer_problem(ref(SENDER_SUBJECTS), "prod") is None
    assert producer_problem(ref(0), "prod") is None


def test_a_push_named_by_another_agent_is_refused_saying_which() -> None:
    for wire in (0, 3, SENDER_SUBJECTS):
        assert producer_problem(ref(wire), "evil") == (
            "output of src pushed by agent evil: this placement takes it from agent prod"
        )


def test_a_push_naming_no_sender_is_taken_only_from_an_older_producers_agent() -> None:
    """The older subject names no sender: only an agent of level 4 or older uses it (0: an
    orchestrator that did not say)."""
    assert producer_problem(ref(4), None) is None
    assert producer_problem(ref(0), None) is None
    why = producer_problem(ref(SENDER_SUBJECTS), None)
    assert why is not None and "without its sender's name" in why


def test_an_output_that_is_no_input_is_left_to_the_core() -> None:
    assert producer_problem(None, "evil") is None
