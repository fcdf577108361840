"""`list` reads only the head of each pipeline record (`read_head`): for arbitrary records it
is what the whole record says, and anything else is a coded error."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings

from orchestrator.reliability.ownership import record_fields
from orchestrator.state.pipelines import PipelineRun
from schemas.codec import DecodeError, decode, encode_trusted
from schemas.failover import PipelineRecord, RecordHead, read_head
from tests.unit.test_record_fields import runs


@settings(max_examples=40, deadline=None)
@given(run=runs())
def test_the_head_is_what_the_whole_record_says(run: PipelineRun) -> None:
    data = encode_trusted(
        record_fields(run, epoch=3, events_seq=0, adoptions=0, mono=50.0, wall=1.7e9)
    )
    whole = decode(data, PipelineRecord)
    assert read_head(data) == RecordHead(
        pipeline_id=whole.pipeline_id, name=whole.name, owner=whole.owner, state=whole.state,
        tasks=len(whole.tasks), submitted_wall=whole.submitted_wall, user=whole.user,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "bad_request"),
        (b"\xc1", "bad_request"),  # a byte msgpack never uses
        (msgpack.packb([1, 2]), "bad_request"),  # not a map
        (msgpack.packb({"pipeline_id": "p", "name": "n"}), "invalid"),  # no owner, no state
        (
            msgpack.packb(
                {"pipeline_id": "p", "name": "n", "owner": "o", "state": "lost", "tasks": []}
            ),
            "invalid",
        ),
        (msgpack.packb({"pipeline_id": "p", "tasks": 3}), "bad_request"),  # tasks not a list
        (msgpack.packb({b"pipeline_id": "p"}), "bad_request"),  # a key not a string
    ],
)
def test_what_is_no_record_is_a_coded_error(data: bytes, code: str) -> None:
    with pytest.raises(DecodeError) as err:
        read_head(data)
    assert err.value.code == code
