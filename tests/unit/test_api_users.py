"""The per-user API subjects (`mars.v1.api.<op>.<user>`): built, parsed and checked; a
submission on one is that user's; `mars` takes its user from `--user` or MARS_USER (that a
client with a user asks on them: tests/integration/test_api_users.py)."""

from __future__ import annotations

import pytest

from console.cli import build_parser
from orchestrator.api.users import as_user, user_of
from schemas import subjects
from schemas.api import SubmitRequest
from schemas.errors import ServiceError
from schemas.pipeline import PipelineSpec
from transport.client import Client

SPEC = PipelineSpec.model_validate(
    {"name": "p", "tasks": [{"id": "t", "run": {"kind": "synthetic", "seconds": 0.1}}]}
)


@pytest.mark.parametrize("base", subjects.API_SUBJECTS)
def test_a_users_subject_names_the_user_and_the_admins_none(base: str) -> None:
    assert subjects.api_as(base, "alice") == f"{base}.alice"
    assert subjects.api_users(base) == f"{base}.*"
    assert subjects.api_user(f"{base}.alice") == "alice"
    assert user_of(f"{base}.alice") == "alice"
    assert subjects.api_user(base) is None and user_of(base) is None


def test_only_the_api_subjects_name_a_user() -> None:
    assert subjects.api_user("mars.v1.api.submit.") is None
    assert subjects.api_user("mars.v1.api.submitx.alice") is None
    assert subjects.api_user("mars.v1.orch.o1.list") is None
    assert subjects.api_user(subjects.replica_status("alice")) is None


@pytest.mark.parametrize("token", ["al@ice", "x" * 129, "ü", "a b", "a.b"])
def test_a_user_that_is_not_an_identity_name_is_invalid(token: str) -> None:
    with pytest.raises(ServiceError) as err:
        user_of(subjects.api_as(subjects.STATUS, token))
    assert err.value.code == "invalid"


def test_a_submission_on_a_users_subject_is_that_users() -> None:
    req = SubmitRequest(pipeline=SPEC, pipeline_id="p1")
    assert as_user(req, None) is req  # the admin's subject: as it says
    mine = as_user(req, "alice")
    assert mine.pipeline.user == "alice" and mine.pipeline_id == "p1"
    assert mine.pipeline.model_copy(update={"user": None}) == SPEC
    named = SubmitRequest(pipeline=SPEC.model_copy(update={"user": "alice"}))
    assert as_user(named, "alice") == named
    assert as_user(named, None) == named  # the admin submits for alice
    with pytest.raises(ServiceError) as err:
        as_user(named, "bob")
    assert err.value.code == "invalid"


def test_a_client_refuses_a_user_that_is_not_an_identity_name() -> None:
    with pytest.raises(ValueError):
        Client(None, user="a.b")  # type: ignore[arg-type]  # (checked before any request)


def test_mars_asks_as_the_user_given_or_mars_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MARS_USER", raising=False)
    assert build_parser().parse_args(["list"]).user is None
    assert build_parser().parse_args(["status", "p1", "--user", "bob"]).user == "bob"
    monkeypatch.setenv("MARS_USER", "alice")
    for argv in (["list"], ["status", "p"], ["cancel", "p"], ["agents"], ["submit", "f"]):
        assert build_parser().parse_args(argv).user == "alice"
    assert build_parser().parse_args(["list", "--user", "bob"]).user == "bob"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["list", "--user", "al.ice"])
