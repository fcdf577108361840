"""How deep a payload that validates as a model can nest, read from the model's types.

`codec.decode` walks every payload received to refuse one nested deeper than MAX_DEPTH before
pydantic sees it (~20% of decoding an offer). A strict model that forbids extra fields and has
no free-form field (`Any`, `object`, a recursive model) only validates payloads whose nesting
its types fix, so for one whose bound is within MAX_DEPTH the walk can wait until validation
fails, to say whether the payload was too deep or merely invalid.
"""

from __future__ import annotations

import enum
import functools
import types
import typing
from collections.abc import Mapping, Sequence, Set
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel

_SCALARS = (str, bytes, int, float, bool, type(None))
_SEQUENCES = (list, tuple, set, frozenset, Sequence, Set)


@functools.cache
def depth_bound(model: type[BaseModel]) -> int | None:
    """Most levels of maps and arrays (the top-level map counted as one) a payload valid as
    `model` can have, or None where the types do not bound it."""
    return _model(model, frozenset())


def _model(model: type[BaseModel], seen: frozenset[type[BaseModel]]) -> int | None:
    if model in seen:
        return None  # recursive: as deep as the sender likes
    if model.model_config.get("extra") != "forbid":
        return None  # unknown fields are accepted unread, at any depth
    seen = seen | {model}
    deepest = 0
    for field in model.model_fields.values():
        d = _type(field.annotation, seen)
        if d is None:
            return None
        deepest = max(deepest, d)
    return 1 + deepest


def _type(tp: Any, seen: frozenset[type[BaseModel]]) -> int | None:
    """Levels of containers a value of type `tp` can take (0 for a scalar)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Annotated:
        return _type(args[0], seen)
    if origin is Literal:
        return 0
    if origin is Union or origin is types.UnionType:
        return _deepest(args, seen, 0)
    if isinstance(tp, type) and origin is None:
        if issubclass(tp, BaseModel):
            return _model(tp, seen)
        if issubclass(tp, _SCALARS) or issubclass(tp, enum.Enum):
            return 0
        return None
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return _deepest(args[1:], seen, 1)
    if isinstance(origin, type) and issubclass(origin, _SEQUENCES):
        return _deepest([a for a in args if a is not Ellipsis], seen, 1)
    return None  # Any, object, a type variable, anything not listed: no bound


def _deepest(args: Sequence[Any], seen: frozenset[type[BaseModel]], add: int) -> int | None:
    if not args:
        return None  # a bare container: items of any kind
    out = 0
    for a in args:
        d = _type(a, seen)
        if d is None:
            return None
        out = max(out, d)
    return add + out


def fixed_depth(model: type[BaseModel], limit: int) -> bool:
    """Whether validating as `model` already keeps a payload within `limit` levels."""
    bound = depth_bound(model)
    return bound is not None and bound <= limit
