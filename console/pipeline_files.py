"""Pipelines written by people: YAML or JSON files, read through the one codec."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from schemas.codec import DecodeError, decode
from schemas.limits import MAX_PAYLOAD_BYTES
from schemas.pipeline import PipelineInput, PipelineSpec


def load_pipeline(path: str | Path, inputs: Sequence[PipelineInput] = ()) -> PipelineSpec:
    """Read a pipeline file, given `inputs` too (they replace any it names alike); raises
    DecodeError (with a code) on anything wrong."""
    p = Path(path)
    raw = p.read_bytes()
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise DecodeError("payload_too_large", f"{p}: file exceeds {MAX_PAYLOAD_BYTES} bytes")
    if p.suffix.lower() not in (".yaml", ".yml"):
        if not inputs:
            return decode(raw, PipelineSpec, "json")
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise DecodeError("bad_request", f"{p}: not valid JSON: {exc}") from exc
        return decode(_json(_given(doc, inputs)), PipelineSpec, "json")
    loader = yaml.SafeLoader(raw)
    try:
        node = loader.get_single_node()
        obj = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise DecodeError("bad_request", f"{p}: not valid YAML: {exc}") from exc
    finally:
        loader.dispose()
    obj = _given(obj, inputs)
    try:
        return decode(_json(obj), PipelineSpec, "json")
    except DecodeError as exc:
        # YAML 1.1 reads `off`, `yes` or `1` as a bool or a number: where the model wants a
        # string (a name, an id), the scalar is taken as it was written, and read again
        if node is None or not _as_written(obj, node, exc.__cause__):
            raise
    return decode(_json(obj), PipelineSpec, "json")


def _given(doc: Any, inputs: Sequence[PipelineInput]) -> Any:
    """The document with these inputs among its `inputs` (replacing any of the same name)."""
    if not inputs or not isinstance(doc, dict):
        return doc
    names = {i.name for i in inputs}
    kept = [
        i for i in doc.get("inputs") or [] if not (isinstance(i, dict) and i.get("name") in names)
    ]
    return {**doc, "inputs": [*kept, *(i.model_dump() for i in inputs)]}


def _json(obj: Any) -> bytes:
    """The document as JSON for the codec; a YAML date or time (`2024-05-01`) as its text,
    which a string field takes and any other refuses with a reason."""
    return json.dumps(obj, default=str).encode()


def _as_written(obj: Any, node: yaml.Node, cause: BaseException | None) -> bool:
    """Put back, as their text, the plain scalars of `obj` that YAML read as something else
    where validation wanted a string; whether any was."""
    if not isinstance(cause, ValidationError):
        return False
    changed = False
    for err in cause.errors():
        if err["type"] != "string_type" or isinstance(err["input"], dict | list):
            continue
        found = _scalar_at(obj, node, err["loc"])
        if found is not None:
            parent, key, text = found
            parent[key] = text
            changed = True
    return changed


def _scalar_at(
    obj: Any, node: yaml.Node, loc: tuple[int | str, ...]
) -> tuple[Any, Any, str] | None:
    """The container, key and source text of the plain scalar at a validation error's `loc`
    (steps that are not keys or indexes of the document, such as a union's tag, are skipped);
    None when it is not one."""
    parent: Any = None
    key: Any = None
    for step in loc:
        if isinstance(obj, dict) and isinstance(node, yaml.MappingNode) and step in obj:
            sub = next((v for k, v in node.value if k.value == step), None)
            if sub is None:
                return None
            parent, key, obj, node = obj, step, obj[step], sub
        elif isinstance(obj, list) and isinstance(node, yaml.SequenceNode):
            if not isinstance(step, int) or not 0 <= step < min(len(obj), len(node.value)):
                return None
            parent, key, obj, node = obj, step, obj[step], node.value[step]
    if parent is None or not isinstance(node, yaml.ScalarNode) or node.style is not None:
        return None  # a quoted scalar is a string already
    return parent, key, str(node.value)
