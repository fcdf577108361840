"""Wire levels: a message for an older peer leaves out what it cannot read, and what is left
reads on that peer's own (closed) models, and on this release's."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import msgpack
import pytest

from console.cli import agent_line, build_parser
from schemas.api import AgentsReply, AgentSummary, ListReply, PipelineSummary
from schemas.base import WireModel
from schemas.codec import Encoding, decode, encode, headers_for
from schemas.pipeline import TaskSpec
from schemas.placement import (
    CancelCommand,
    ConsumerRef,
    DataTransfer,
    InputRef,
    OfferBatch,
    TaskOffer,
)
from schemas.wire import ADDED, WIRE_HEADER, WIRE_LEVEL, level_of

ROOT = Path(__file__).resolve().parents[2]
#: The last commit before wire levels whose messages differ from level 1 only by ADDED's
#: fields (2026-12-02): what a peer of the release before levels reads.
LEVEL_1_COMMIT = "d55d9f2"


def onnx_then_sleep() -> list[TaskSpec]:
    return [
        TaskSpec.model_validate(
            {"id": "d", "run": {"kind": "onnx", "model": "tiny_cnn", "timeout_s": 5.0}}
        ),
        TaskSpec.model_validate(
            {"id": "s", "run": {"kind": "synthetic", "seconds": 0.1}, "deps": ["d"]}
        ),
    ]


def batch() -> OfferBatch:
    d, s = onnx_then_sleep()
    common: dict[str, Any] = {
        "pipeline_id": "p", "agent_id": "a", "incarnation": "i1", "device_id": "cpu0"
    }  # fmt: skip
    return OfferBatch(
        offers=[
            TaskOffer(
                **common,
                slot=0,
                token=7,
                order=0,
                task=d,
                inputs=[],
                consumers=[ConsumerRef(task_id="s", agent_id="a", wire=WIRE_LEVEL)],
            ),
            TaskOffer(
                **common,
                slot=0,
                token=8,
                order=1,
                task=s,
                inputs=[InputRef(task_id="d", agent_id="a", ready=False, token=7)],
                consumers=[],
            ),
        ]
    )


def transfer() -> DataTransfer:
    body = b'{"n":3}'
    return DataTransfer(
        pipeline_id="p", producer="d", consumer="s", token=7, data=body,
        sha256=hashlib.sha256(body).hexdigest(), media_type="application/json",
    )  # fmt: skip


def listing() -> ListReply:
    return ListReply(
        pipelines=[
            PipelineSummary(
                pipeline_id="p", name="n", state="running", tasks=2, submitted=1.7e9, owner="orch-1"
            )
        ],
        unanswered=["orch-2"],
    )


def agents() -> AgentsReply:
    one: dict[str, Any] = {"agent_id": "e1", "incarnation": "i", "site": "s", "tier": "edge"}
    return AgentsReply(
        agents=[AgentSummary(**one, alive=True, devices=["cpu0:cpu"], wire=WIRE_LEVEL)]
    )


def fields(data: bytes, encoding: Encoding) -> Any:
    return json.loads(data) if encoding == "json" else msgpack.unpackb(data, strict_map_key=False)


def test_every_added_field_has_a_default() -> None:
    """A message from an older peer lacks the field: this release must still read it."""
    for model, added in ADDED.items():
        for name, level in added.items():
            assert 1 < level <= WIRE_LEVEL, (model.__name__, name)
            assert not model.model_fields[name].is_required(), (model.__name__, name)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_level_1_message_leaves_out_the_added_fields_at_any_depth(encoding: Encoding) -> None:
    old = fields(encode(batch(), encoding, level=1), encoding)
    d, s = old["offers"]
    assert "timeout_s" not in d["task"]["run"] and "token" not in s["inputs"][0]
    assert d["token"] == 7 and s["inputs"][0]["task_id"] == "d"  # the rest as it was
    new = fields(encode(batch(), encoding), encoding)
    assert new["offers"][0]["task"]["run"]["timeout_s"] == 5.0
    assert new["offers"][1]["inputs"][0]["token"] == 7
    # read by this release, the fields left out take their defaults
    back = decode(encode(batch(), encoding, level=1), OfferBatch, encoding)
    assert back.offers[1].inputs[0].token == 0
    assert back.offers[0].task.run.timeout_s == 60.0  # type: ignore[union-attr]
    assert decode(encode(batch(), encoding), OfferBatch, encoding) == batch()

    assert "wire" not in old["offers"][0]["consumers"][0]
    assert new["offers"][0]["consumers"][0]["wire"] == WIRE_LEVEL

    lst = fields(encode(listing(), encoding, level=1), encoding)
    assert "unanswered" not in lst
    assert not {"submitted", "owner"} & set(lst["pipelines"][0])


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_transfer_names_its_media_type_and_an_offer_its_consumers_level_from_level_4(
    encoding: Encoding,
) -> None:
    """What a level-3 agent is sent has neither: it would refuse the whole message."""
    assert "media_type" not in fields(encode(transfer(), encoding, level=3), encoding)
    assert fields(encode(transfer(), encoding, level=4), encoding)["media_type"] == (
        "application/json"
    )
    assert decode(encode(transfer(), encoding, level=3), DataTransfer, encoding).media_type is None
    assert decode(encode(transfer(), encoding), DataTransfer, encoding) == transfer()
    at_3 = fields(encode(batch(), encoding, level=3), encoding)
    assert "wire" not in at_3["offers"][0]["consumers"][0]
    (ref,) = fields(encode(batch(), encoding, level=4), encoding)["offers"][0]["consumers"]
    assert ref == {"task_id": "s", "agent_id": "a", "wire": WIRE_LEVEL}


def test_a_message_with_no_added_field_is_the_same_at_every_level() -> None:
    plain = CancelCommand(pipeline_id="p", task_ids=["a"], max_token=3)
    for enc in ("json", "msgpack"):
        assert encode(plain, enc, level=1) == encode(plain, enc)


@pytest.mark.parametrize(
    ("header", "level"),
    [(None, 1), ("1", 1), ("2", 2), (str(WIRE_LEVEL + 5), WIRE_LEVEL), ("x", 1), ("-1", 1),
     ("", 1), ("0", 1), ("99999999999", 1), ("²", 1), ("٣", 1), (" 2", 1)],
)  # fmt: skip
def test_a_senders_level_comes_from_its_header(header: str | None, level: int) -> None:
    assert level_of(None if header is None else {WIRE_HEADER: header}) == level


def test_every_message_with_headers_names_this_releases_level() -> None:
    assert level_of(headers_for("msgpack")) == level_of(headers_for("json")) == WIRE_LEVEL


def _level_1_schemas(into: Path) -> Path:
    """The `schemas` package of LEVEL_1_COMMIT, from this checkout's history."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", LEVEL_1_COMMIT, "schemas"],
            capture_output=True, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"{LEVEL_1_COMMIT} is not in this checkout's history (a shallow clone)")
    with tarfile.open(fileobj=BytesIO(tar)) as tf:
        tf.extractall(into, filter="data")
    return into


#: Decodes each (model, encoding, base64 payload) of stdin with the schemas on its path.
READER = """
import base64, json, sys
import schemas.api, schemas.placement
from schemas.codec import DecodeError, decode
out = [schemas.__file__]
for name, enc, data in json.load(sys.stdin):
    model = getattr(schemas.placement, name, None) or getattr(schemas.api, name)
    try:
        decode(base64.b64decode(data), model, enc)
        out.append("ok")
    except DecodeError as exc:
        out.append(exc.code)
print(json.dumps(out))
"""


def test_a_peer_of_the_release_before_levels_reads_level_1_and_refuses_level_2(
    tmp_path: Path,
) -> None:
    """The previous release's own models (closed, from git), in a process of their own: a
    level-1 message reads; the same message at this release's level is refused `invalid`,
    which is what a fleet upgraded out of order met before levels."""
    old = _level_1_schemas(tmp_path)
    cases = [
        (type(m).__name__, enc, base64.b64encode(encode(m, enc, level)).decode())
        for m in (batch(), listing(), agents(), transfer())
        for enc in ("json", "msgpack")
        for level in (1, WIRE_LEVEL)
    ]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", READER], input=json.dumps(cases), capture_output=True, text=True,
        cwd=old, env={"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"}, check=True,
    )  # fmt: skip
    where, *got = json.loads(run.stdout)
    assert Path(where).is_relative_to(old)  # the old package, not this checkout's
    assert got == ["ok", "invalid"] * 8, list(zip(cases, got, strict=True))


def test_mars_agents_marks_an_agent_of_an_older_level_and_version_names_ours(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = AgentSummary(
        agent_id="e1", incarnation="i", site="s", tier="edge", alive=True, devices=["cpu0:cpu"]
    )
    assert "wire=" not in agent_line(a)  # not said: a replica before levels answered
    assert "wire=" not in agent_line(a.model_copy(update={"wire": WIRE_LEVEL}))
    assert agent_line(a.model_copy(update={"wire": 1})).endswith(" wire=1 (an older release)")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert capsys.readouterr().out.strip().endswith(f"(wire level {WIRE_LEVEL})")


#: Every wire model of the schemas on its path, with its fields, as JSON.
FIELDS = """
import importlib, json, pkgutil
import schemas
from schemas.base import WireModel
for m in pkgutil.iter_modules(schemas.__path__):
    importlib.import_module(f"schemas.{m.name}")
seen, todo = {}, list(WireModel.__subclasses__())
while todo:
    cls = todo.pop()
    seen[cls.__name__] = sorted(cls.model_fields)
    todo += cls.__subclasses__()
print(json.dumps(seen))
"""


def _fields(path: Path) -> dict[str, list[str]]:
    run = subprocess.run(
        [sys.executable, "-c", FIELDS], capture_output=True, text=True, cwd=path,
        env={"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"}, check=True,
    )  # fmt: skip
    out: dict[str, list[str]] = json.loads(run.stdout)
    return out


def test_every_field_added_since_level_1_is_registered(tmp_path: Path) -> None:
    """A field added to a model the release before levels had is left out for its peers
    only if ADDED names it: one added without it would be refused by them again. (A model
    new since then reaches only peers that know it.)"""
    old, new = _fields(_level_1_schemas(tmp_path)), _fields(ROOT)
    registered = {m.__name__: set(f) for m, f in ADDED.items()}
    unregistered = {
        name: added for name, fields in new.items() if name in old
        if (added := set(fields) - set(old[name]) - registered.get(name, set()))
    }  # fmt: skip
    assert unregistered == {}, "add each to schemas/wire.py ADDED at the next level"
    assert all(set(f) <= set(new[name]) - set(old[name]) for name, f in registered.items())


class _ByNumber(WireModel):
    """(A test's own model: added fields under a map with integer keys.)"""

    refs: dict[int, InputRef]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_added_fields_are_left_out_under_maps_too(encoding: Encoding) -> None:
    m = _ByNumber(refs={3: InputRef(task_id="d", agent_id="a", ready=True, token=9)})
    old = fields(encode(m, encoding, level=1), encoding)
    (ref,) = old["refs"].values()
    assert "token" not in ref and ref["task_id"] == "d"
    (ref,) = fields(encode(m, encoding), encoding)["refs"].values()
    assert ref["token"] == 9
