"""Values on the wire: what bytes decode to for a task, what a task's return encodes to, and
inputs bound by name."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent import values
from schemas import PipelineSpec, TaskSpec


def test_arrays_and_sets_of_them_round_trip_and_are_known_by_their_bytes() -> None:
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    data, kind = values.encode(a)
    assert kind == values.NPY and values.sniff(data) == values.NPY
    assert np.array_equal(values.decode(data), a) and values.decode(data).dtype == np.int16
    data, kind = values.encode({"x": a, "y": np.ones(2)})
    assert kind == values.NPZ and values.sniff(data) == values.NPZ
    got = values.decode(data)
    assert sorted(got) == ["x", "y"] and np.array_equal(got["x"], a)


def test_other_values_by_their_python_type_or_as_declared() -> None:
    assert values.encode(b"\x00\x01") == (b"\x00\x01", values.BYTES)
    assert values.encode("é") == ("é".encode(), values.TEXT)
    assert values.encode({"acc": 0.5, "n": [1, 2]}) == (b'{"acc":0.5,"n":[1,2]}', values.JSON)
    assert values.decode(b'{"a": 1}', values.JSON) == {"a": 1}
    assert values.decode(b'{"a": 1}') == b'{"a": 1}'  # undeclared: bytes (JSON is not guessed)
    with pytest.raises(values.BadValue, match="declared application/x-npy, but the task made"):
        values.encode({"acc": 0.5}, "application/x-npy")
    with pytest.raises(values.BadValue, match="not JSON-able"):
        values.encode(object())
    with pytest.raises(values.BadValue, match="not a valid application/x-npy value"):
        values.decode(b"\x93NUMPY garbage")


def test_inputs_are_bound_by_name_or_by_dep_and_members_are_picked() -> None:
    spec = PipelineSpec.model_validate({"name": "p", "tasks": [
        {"id": "a", "run": {"kind": "synthetic"}},
        {"id": "b", "run": {"kind": "synthetic"}},
        {"id": "c", "run": {"kind": "synthetic"}, "deps": ["a", "b"],
         "inputs": [{"name": "pixels", "source": "a", "member": "x"},
                    {"name": "meta", "source": "b"}]},
        {"id": "d", "run": {"kind": "synthetic"}, "deps": ["a"]},
    ]})  # fmt: skip
    x = np.ones((2, 2), dtype=np.float32)
    got = {"a": values.npz({"x": x}), "b": b'{"k": 3}'}
    types = {"a": None, "b": values.JSON}
    bound = values.bind(spec.tasks[2], got, types)
    assert np.array_equal(bound["pixels"], x) and bound["meta"] == {"k": 3}
    assert sorted(values.bind(spec.tasks[3], got, types)) == ["a"]  # by the dep's id
    files = values.raw(spec.tasks[2], got, types)
    assert values.sniff(files["pixels"]) == values.NPY and files["meta"] == b'{"k": 3}'
    with pytest.raises(values.BadValue, match="has no member 'y'"):
        values.bind(
            TaskSpec.model_validate({"id": "e", "run": {"kind": "synthetic"}, "deps": ["a"],
                                     "inputs": [{"name": "q", "source": "a", "member": "y"}]}),
            got, types,
        )  # fmt: skip


def test_an_input_from_a_task_that_is_not_a_dep_is_refused() -> None:
    with pytest.raises(ValueError, match="comes from a, not one of its deps"):
        PipelineSpec.model_validate({"name": "p", "tasks": [
            {"id": "a", "run": {"kind": "synthetic"}},
            {"id": "b", "run": {"kind": "synthetic"}, "inputs": [{"name": "x", "source": "a"}]},
        ]})  # fmt: skip
