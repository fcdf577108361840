"""The depth a model's types allow bounds every payload that validates as it."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from pydantic import BaseModel, ConfigDict

from schemas import PUBLIC_MODELS, SubmitRequest, WireModel
from schemas.codec import DecodeError, decode
from schemas.depth import depth_bound, fixed_depth
from schemas.limits import MAX_DEPTH


def payload_depth(obj: object) -> int:
    """Levels of maps and arrays, the outermost counted as one (the rule `decode` enforces)."""
    if isinstance(obj, dict):
        return 1 + max((payload_depth(v) for v in obj.values()), default=0)
    if isinstance(obj, list):
        return 1 + max((payload_depth(v) for v in obj), default=0)
    return 0


class _Leaf(WireModel):
    xs: list[int] = []
    tags: dict[str, str] = {}


class _Tree(WireModel):
    leaves: list[_Leaf]
    pair: tuple[float, float] = (0.0, 0.0)
    maybe: _Leaf | None = None


class _Free(WireModel):
    blob: dict[str, Any]


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")
    x: int


class _Node(WireModel):
    kids: list[_Node] = []


def test_bounds_follow_the_types() -> None:
    assert depth_bound(_Leaf) == 2  # the map, then a list or a map of scalars
    assert depth_bound(_Tree) == 4  # map > list > leaf map > list
    for unbounded in (_Free, _Loose, _Node):
        assert depth_bound(unbounded) is None, unbounded.__name__
        assert not fixed_depth(unbounded, MAX_DEPTH)


def test_every_wire_model_has_a_fixed_depth_within_the_limit() -> None:
    """Else its messages are walked before validation, as before (slower, still safe)."""
    loose = [m.__name__ for m in PUBLIC_MODELS if not fixed_depth(m, MAX_DEPTH)]
    assert loose == []


def test_a_deep_payload_is_still_too_deep_for_a_model_of_fixed_depth() -> None:
    deep: object = "x"
    for _ in range(MAX_DEPTH + 1):
        deep = {"k": deep}
    cases = [
        {"pipeline": {"name": "p", "tasks": [], "labels": deep}},  # deep inside a field
        {"pipeline": deep},
    ]
    deep_list: object = 1
    for _ in range(MAX_DEPTH + 1):
        deep_list = [deep_list]
    cases.append(deep_list)  # not even a map: too deep first
    for payload in cases:
        for enc, raw in (("msgpack", msgpack.packb(payload)), ("json", json.dumps(payload))):
            with pytest.raises(DecodeError) as err:
                decode(raw if isinstance(raw, bytes) else raw.encode(), SubmitRequest, enc)  # type: ignore[arg-type]
            assert err.value.code == "too_deep", enc
    for raw in (b"[1, 2]", b'{"pipeline": ', b"\xff\xfe", b'"text"'):
        with pytest.raises(DecodeError) as err:
            decode(raw, SubmitRequest, "json")  # pydantic's parser first, then the reason
        assert err.value.code == "bad_request", raw
    with pytest.raises(DecodeError) as err:
        decode(b'{"pipeline": {"name": "p", "tasks": []}}', SubmitRequest, "json")
    assert err.value.code == "invalid" and "pipeline.tasks" in err.value.details
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb({1: "x"}, strict_types=False), SubmitRequest)
    assert err.value.code == "bad_request"  # a map key that is not a string, as before
