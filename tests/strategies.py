"""Hypothesis strategies that draw valid wire payloads from each model's own JSON Schema.

Small on purpose (a few items per list) so property tests stay fast; cross-field rules the
schema cannot express (DAG checks) are left to the model, and callers filter with `assume`.
"""

from __future__ import annotations

import base64
from typing import Any

from hypothesis import strategies as st

MAX_ITEMS = 3
JSON = Any


def _num(schema: dict[str, Any], integer: bool) -> st.SearchStrategy[JSON]:
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    if integer:
        lo_i = None if lo is None else int(lo) + (1 if "exclusiveMinimum" in schema else 0)
        hi_i = None if hi is None else int(hi) - (1 if "exclusiveMaximum" in schema else 0)
        return st.integers(min_value=lo_i, max_value=hi_i)
    return st.floats(
        min_value=lo,
        max_value=hi,
        exclude_min="exclusiveMinimum" in schema,
        exclude_max="exclusiveMaximum" in schema,
        allow_nan=False,
        allow_infinity=False,
    )


def _string(schema: dict[str, Any]) -> st.SearchStrategy[JSON]:
    if schema.get("format") in ("base64", "binary", "base64url"):
        return st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())
    lo, hi = schema.get("minLength", 0), min(schema.get("maxLength", 24), 24)
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True).filter(
            lambda s: lo <= len(s) <= schema.get("maxLength", 10**9)
        )
    return st.text(min_size=lo, max_size=max(lo, hi))


def from_json_schema(
    schema: dict[str, Any], defs: dict[str, Any] | None = None
) -> st.SearchStrategy[JSON]:
    defs = defs if defs is not None else schema.get("$defs", {})
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return st.deferred(lambda: from_json_schema(defs[name], defs))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_json_schema(s, defs) for s in schema[key]])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return from_json_schema(schema["allOf"][0], defs)
    kind = schema.get("type")
    if kind == "object":
        props: dict[str, Any] = schema.get("properties", {})
        if not props and isinstance(schema.get("additionalProperties"), dict):
            key_schema = schema.get("propertyNames", {"type": "string", "maxLength": 16})
            return st.dictionaries(
                _string(key_schema),
                from_json_schema(schema["additionalProperties"], defs),
                max_size=min(schema.get("maxProperties", MAX_ITEMS), MAX_ITEMS),
            )
        required = set(schema.get("required", []))
        fields: dict[str, st.SearchStrategy[JSON]] = {}
        optional: dict[str, st.SearchStrategy[JSON]] = {}
        for name, sub in props.items():
            strat = st.just([]) if name == "deps" else from_json_schema(sub, defs)
            (fields if name in required else optional)[name] = strat
        return st.fixed_dictionaries(fields, optional=optional)
    if kind == "array":
        lo = schema.get("minItems", 0)
        hi = max(lo, min(schema.get("maxItems", MAX_ITEMS), MAX_ITEMS))
        return st.lists(from_json_schema(schema.get("items", {}), defs), min_size=lo, max_size=hi)
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return _num(schema, True)
    if kind == "number":
        return _num(schema, False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.none()
