"""The one place bytes become models and models become bytes.

msgpack is the default encoding; a message whose ``Content-Type`` header names JSON is read as
JSON, and its reply is written in JSON too (so ``nats req`` from a shell works). Size, depth and
length limits are enforced before pydantic sees anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import msgpack
from pydantic import ValidationError

from schemas.base import WireModel
from schemas.depth import fixed_depth
from schemas.errors import ErrorCode, ErrorEnvelope
from schemas.limits import MAX_CONTAINER_LEN, MAX_DEPTH, MAX_PAYLOAD_BYTES, MAX_STR_LEN
from schemas.wire import WIRE_HEADER, WIRE_LEVEL, dump_for, holds_added

Encoding = Literal["msgpack", "json"]
M = TypeVar("M", bound=WireModel)

CONTENT_TYPE = "Content-Type"
JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"
#: Set on error replies, following the nats.micro convention.
ERROR_HEADER = "Nats-Service-Error-Code"
WIRE_LEVEL_TEXT = str(WIRE_LEVEL)


class DecodeError(Exception):
    """A payload that cannot become the expected model; carries the wire error code."""

    def __init__(self, code: ErrorCode, message: str, details: dict[str, str] | None = None):
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.details = details or {}

    def envelope(self) -> ErrorEnvelope:
        return ErrorEnvelope(code=self.code, message=self.message[:2048], details=self.details)


def encoding_of(headers: Mapping[str, str] | None) -> Encoding:
    if headers:
        ctype = headers.get(CONTENT_TYPE) or headers.get(CONTENT_TYPE.lower()) or ""
        if "json" in ctype.lower():
            return "json"
    return "msgpack"


def headers_for(encoding: Encoding) -> dict[str, str]:
    """A message's headers: its encoding, and the level of the wire this release reads."""
    return {
        CONTENT_TYPE: JSON_TYPE if encoding == "json" else MSGPACK_TYPE,
        WIRE_HEADER: WIRE_LEVEL_TEXT,
    }


def encode(model: WireModel, encoding: Encoding = "msgpack", level: int = WIRE_LEVEL) -> bytes:
    """`level`: the receiver's (schemas/wire.py); fields added after it are left out."""
    if level < WIRE_LEVEL and holds_added(type(model)):
        if encoding == "json":
            return json.dumps(dump_for(model, level, "json"), separators=(",", ":")).encode()
        return msgpack.packb(dump_for(model, level, "python"), use_bin_type=True)  # type: ignore[no-any-return]
    if encoding == "json":
        return model.model_dump_json().encode()
    return msgpack.packb(model.model_dump(mode="python"), use_bin_type=True)  # type: ignore[no-any-return]


def encode_trusted(fields: Mapping[str, Any]) -> bytes:
    """msgpack of a model's fields built by this process from validated values, without the
    model: the same bytes as `encode` of that model where the mapping follows its field order
    with its types (the builder's tests check it). For payloads written often, where building
    the model costs most of the write."""
    return msgpack.packb(fields, use_bin_type=True)  # type: ignore[no-any-return]


def _check_depth(obj: Any) -> None:
    """Nesting at most MAX_DEPTH and string map keys. Runs on every message received, so it
    walks one level at a time and looks only at containers (a message is mostly scalars; the
    decoders make plain dicts and lists, never subclasses)."""
    level = [obj]
    depth = 0
    while level:
        level = [x for x in level if type(x) is dict or type(x) is list]
        if not level:
            return
        depth += 1
        if depth > MAX_DEPTH:
            raise DecodeError("too_deep", f"payload nests deeper than {MAX_DEPTH} levels")
        nxt: list[Any] = []
        for item in level:
            if type(item) is dict:
                for k in item:
                    if type(k) is not str:
                        raise DecodeError("bad_request", "map keys must be strings")
                nxt += item.values()
            else:
                nxt += item
        level = nxt


def _unpack(data: bytes, encoding: Encoding) -> Any:
    if encoding == "json":
        try:
            return json.loads(data)
        except RecursionError as exc:
            raise DecodeError("too_deep", "JSON nests too deeply") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError("bad_request", f"not valid JSON: {exc}") from exc
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_STR_LEN,
            max_bin_len=MAX_PAYLOAD_BYTES,
            max_array_len=MAX_CONTAINER_LEN,
            max_map_len=MAX_CONTAINER_LEN,
            max_ext_len=0,
        )
    except RecursionError as exc:
        raise DecodeError("too_deep", "msgpack nests too deeply") from exc
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
    ) as exc:
        raise DecodeError("bad_request", f"not valid msgpack: {type(exc).__name__}") from exc


def decode(data: bytes, model: type[M], encoding: Encoding = "msgpack") -> M:
    """Bytes -> validated model, or DecodeError with a code; never anything else."""
    if len(data) > MAX_PAYLOAD_BYTES:
        raise DecodeError(
            "payload_too_large", f"payload of {len(data)} bytes exceeds {MAX_PAYLOAD_BYTES}"
        )
    if not data:
        raise DecodeError("bad_request", "empty payload")
    # A payload valid as a model of fixed depth is within MAX_DEPTH, so the depth walk runs
    # only for one that fails validation, to tell too deep from invalid (schemas/depth.py);
    # such a model's JSON goes to pydantic's own parser, read a second time only to say why
    # it failed.
    fixed = fixed_depth(model, MAX_DEPTH)
    if fixed and encoding == "json":
        try:
            return model.model_validate_json(data)
        except ValidationError as exc:
            _screen(_unpack(data, encoding))
            raise _invalid(model, exc) from exc
        except RecursionError as exc:
            raise DecodeError("too_deep", "payload nests too deeply") from exc
    obj = _unpack(data, encoding)
    if not fixed or not isinstance(obj, dict):
        _screen(obj)
    try:
        if encoding == "json":
            # JSON carries bytes as base64 strings; let pydantic's JSON mode handle that.
            return model.model_validate_json(data)
        return model.model_validate(obj)
    except ValidationError as exc:
        if fixed:
            _screen(obj)
        raise _invalid(model, exc) from exc
    except RecursionError as exc:
        raise DecodeError("too_deep", "payload nests too deeply") from exc


def _screen(obj: Any) -> None:
    """What is wrong with a payload before its fields: too deep, bad keys, not a map."""
    _check_depth(obj)
    if not isinstance(obj, dict):
        raise DecodeError("bad_request", f"expected a map/object, got {type(obj).__name__}")


def _invalid(model: type[WireModel], exc: ValidationError) -> DecodeError:
    details: dict[str, str] = {}
    for err in exc.errors()[:50]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        details[loc[:256]] = str(err["msg"])[:2048]
    return DecodeError(
        "invalid", f"{model.__name__} failed validation ({exc.error_count()} errors)", details
    )


def error_reply(
    code: ErrorCode,
    message: str,
    details: dict[str, str] | None = None,
    encoding: Encoding = "msgpack",
) -> tuple[bytes, dict[str, str]]:
    """Bytes and headers of an error reply."""
    env = ErrorEnvelope(code=code, message=message[:2048], details=details or {})
    headers = headers_for(encoding)
    headers[ERROR_HEADER] = code
    return encode(env, encoding), headers


class RemoteError(Exception):
    """An error envelope received in reply to a request."""

    def __init__(self, envelope: ErrorEnvelope):
        super().__init__(f"{envelope.code}: {envelope.message}")
        self.envelope = envelope

    @property
    def code(self) -> ErrorCode:
        return self.envelope.code


def decode_reply(data: bytes, headers: Mapping[str, str] | None, model: type[M]) -> M:
    """Decode a reply that is either `model` or an error envelope (raised as RemoteError)."""
    enc = encoding_of(headers)
    if headers and headers.get(ERROR_HEADER):
        raise RemoteError(decode(data, ErrorEnvelope, enc))
    return decode(data, model, enc)
