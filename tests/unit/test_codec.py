"""Every public model round-trips through the codec in both encodings; bad bytes get codes."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas import PUBLIC_MODELS, PipelineSpec, SubmitRequest, WireModel
from schemas.codec import DecodeError, decode, decode_reply, encode, error_reply
from schemas.depth import depth_bound
from schemas.errors import ErrorEnvelope
from schemas.limits import MAX_DEPTH, MAX_PAYLOAD_BYTES
from tests.strategies import from_json_schema
from tests.unit.test_depth import payload_depth


def _pipeline_dict(n: int = 3) -> dict[str, object]:
    tasks = [
        {
            "id": f"t{i}",
            "run": {"kind": "synthetic", "seconds": 0.01},
            "deps": [f"t{i - 1}"] if i else [],
        }
        for i in range(n)
    ]
    return {"name": "p", "tasks": tasks}


@pytest.mark.parametrize("model", PUBLIC_MODELS, ids=lambda m: m.__name__)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_public_models_round_trip(model: type[WireModel], data: st.DataObject) -> None:
    # valid instances come from the model's own published JSON Schema
    raw = data.draw(from_json_schema(model.model_json_schema()))
    try:
        obj = model.model_validate_json(json.dumps(raw))
    except ValidationError:
        assume(False)  # cross-field rules (e.g. DAG checks) the schema cannot express
        raise
    for enc in ("msgpack", "json"):
        assert decode(encode(obj, enc), model, enc) == obj
    # what lets `decode` skip its depth walk for a valid payload (schemas/depth.py)
    bound = depth_bound(model)
    assert bound is not None
    assert payload_depth(msgpack.unpackb(encode(obj), raw=False)) <= bound
    assert payload_depth(json.loads(encode(obj, "json"))) <= bound


def test_pipeline_rejects_cycles_unknown_deps_and_duplicates() -> None:
    good = _pipeline_dict()
    PipelineSpec.model_validate(good)
    cyc = _pipeline_dict()
    cyc["tasks"][0]["deps"] = ["t2"]  # type: ignore[index]
    unknown = _pipeline_dict()
    unknown["tasks"][1]["deps"] = ["nope"]  # type: ignore[index]
    dup = _pipeline_dict()
    dup["tasks"][1]["id"] = "t0"  # type: ignore[index]
    for bad, words in ((cyc, "cycle"), (unknown, "unknown task"), (dup, "duplicate")):
        with pytest.raises(DecodeError) as err:
            decode(json.dumps(bad).encode(), PipelineSpec, "json")
        assert err.value.code == "invalid"
        assert any(words in v for v in err.value.details.values())


def test_limits_are_enforced_before_validation() -> None:
    with pytest.raises(DecodeError) as err:
        decode(b"\x00" * (MAX_PAYLOAD_BYTES + 1), SubmitRequest)
    assert err.value.code == "payload_too_large"
    deep: object = 1
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    for enc, raw in (
        ("msgpack", msgpack.packb({"x": deep})),
        ("json", json.dumps({"x": deep}).encode()),
    ):
        with pytest.raises(DecodeError) as err:
            decode(raw, SubmitRequest, enc)  # type: ignore[arg-type]
        assert err.value.code == "too_deep"
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb({"pipeline": _pipeline_dict(), "extra": 1}), SubmitRequest)
    assert err.value.code == "invalid" and "extra" in err.value.details
    with pytest.raises(DecodeError) as err:
        decode(b"", SubmitRequest)
    assert err.value.code == "bad_request"


def test_strings_and_numbers_are_bounded() -> None:
    spec = _pipeline_dict(1)
    spec["name"] = "x" * 500
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb({"pipeline": spec}), SubmitRequest)
    assert "pipeline.name" in err.value.details
    spec = _pipeline_dict(1)
    spec["tasks"][0]["run"]["seconds"] = float("inf")  # type: ignore[index]
    with pytest.raises(DecodeError):
        decode(msgpack.packb({"pipeline": spec}), SubmitRequest)
    spec = _pipeline_dict(1)
    spec["tasks"][0]["id"] = "has.dot"  # type: ignore[index]
    with pytest.raises(DecodeError):
        decode(msgpack.packb({"pipeline": spec}), SubmitRequest)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_escape_as_other_exceptions(raw: bytes) -> None:
    for enc in ("msgpack", "json"):
        try:
            decode(raw, SubmitRequest, enc)
        except DecodeError as exc:
            assert exc.code in {"bad_request", "invalid", "too_deep", "payload_too_large"}


def test_error_reply_is_recognised_by_decode_reply() -> None:
    body, headers = error_reply("not_found", "no such pipeline", {"id": "x"}, "json")
    assert json.loads(body)["code"] == "not_found"
    from schemas.codec import RemoteError

    with pytest.raises(RemoteError) as err:
        decode_reply(body, headers, SubmitRequest)
    assert err.value.envelope == ErrorEnvelope(
        code="not_found", message="no such pipeline", details={"id": "x"}
    )


def test_a_committed_result_carries_every_field_of_its_event() -> None:
    from schemas.events import TaskEvent, TaskOutcome
    from schemas.recovery import TaskResult

    ev = TaskEvent(
        event_id="e1", pipeline_id="p", task_id="t", agent_id="a", incarnation="i",
        device_id="d", token=7, state="succeeded", duration_s=0.5, output_bytes=12,
        result="ok", error="",
    )  # fmt: skip
    rec = TaskResult.of(ev, "orch-1")
    for name in TaskOutcome.model_fields:
        assert getattr(rec, name) == getattr(ev, name), name
    assert rec.committed_by == "orch-1"
    assert decode(encode(rec), TaskResult) == rec


def test_server_advisories_keep_what_recovery_reads_and_refuse_garbage() -> None:
    """nats-server's own JSON (extra fields ignored); anything else is a DecodeError."""
    from schemas.advisories import ConnectionAdvisory

    raw = json.dumps({
        "type": "io.nats.server.advisory.v1.client_connect", "id": "x",
        "server": {"name": "n", "id": "SRV1", "ver": "2.10"},
        "client": {"id": 42, "name": "mars-agent-a1", "lang": "python3", "acc": "MARS"},
    }).encode()  # fmt: skip
    adv = decode(raw, ConnectionAdvisory, "json")
    assert (adv.server.id, adv.client.id, adv.client.name) == ("SRV1", 42, "mars-agent-a1")
    for bad in (b"[1, 2]", b"{}", b'{"client": {"id": "forty-two"}}', b"\xff"):
        with pytest.raises(DecodeError):
            decode(bad, ConnectionAdvisory, "json")


def _too_deep(obj: object, depth: int = 1) -> bool:
    if not isinstance(obj, dict | list):
        return False
    vals = obj.values() if isinstance(obj, dict) else obj
    return depth > MAX_DEPTH or any(_too_deep(v, depth + 1) for v in vals)


def _bad_keys(obj: object) -> bool:
    if isinstance(obj, dict):
        return any(not isinstance(k, str) for k in obj) or any(_bad_keys(v) for v in obj.values())
    return isinstance(obj, list) and any(_bad_keys(v) for v in obj)


_nested = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(st.text(max_size=2) | st.integers(0, 3), kids, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_nested, st.integers(0, MAX_DEPTH + 2))
def test_depth_and_key_check_matches_the_rule(obj: object, wrap: int) -> None:
    """The level-by-level walk says what the rule, written recursively, says."""
    from schemas.codec import _check_depth

    for _ in range(wrap):
        obj = [obj]
    want = {c for c, bad in (("too_deep", _too_deep(obj)), ("bad_request", _bad_keys(obj))) if bad}
    try:
        _check_depth(obj)
        got = None
    except DecodeError as exc:
        got = exc.code
    assert got in want if want else got is None  # with both problems, either may come first
