"""Artifacts: ONNX models and Python bundles shipped to agents through the object store.

An artifact's bytes are stored once, under their sha256, in the object store
`subjects.ARTIFACTS_BUCKET`; the names people give them live in the KV bucket
`subjects.ARTIFACT_NAMES_BUCKET`, one key `<name>.<sha256>` per (name, content) holding an
`ArtifactInfo`. A task refers to one as `name@sha256`: the digest pins the bytes (an agent
verifies them before use), the name says which put it came from. `mars artifact put` and
`rm` talk to JetStream directly: no orchestrator holds the bytes or answers for them.

An ONNX model's graph features (`ModelFeatures`) live with its bytes, in the object's own meta
in the object store (header `FEATURES_HEADER`, see `features_headers`), never on its entry:
an `ArtifactInfo` stays as the releases since level 4 wrote it, since a reader refuses a
field it does not know and KV entries say nothing of their writer's level.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from schemas.base import WireModel
from schemas.limits import Ident

ArtifactKind = Literal["onnx", "python-bundle"]
#: Largest artifact a put accepts (an agent's cache bound may be smaller: it then refuses it).
MAX_ARTIFACT_BYTES = 4 << 30
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
#: `name@sha256` (lower-case hex): how a task names an artifact.
REF_PATTERN = r"^[A-Za-z0-9_-]{1,128}@[0-9a-f]{64}$"
ArtifactRefText = Annotated[str, StringConstraints(pattern=REF_PATTERN)]
_REF = re.compile(REF_PATTERN)
#: Graph feature values by name (orchestrator/predictor/features.py `GraphFeatures`; a
#: reader keeps the names it knows).
FeatureValues = Annotated[
    dict[
        Annotated[str, StringConstraints(pattern=r"^[a-z_]{1,32}$")],
        Annotated[float, Field(allow_inf_nan=False)],
    ],
    Field(max_length=64),
]


class ModelFeatures(WireModel):
    """An ONNX model's graph features, linear in the batch size: `base + per_batch * batch`
    (read by `mars artifact put`, so the predictor scores a model it was never built with)."""

    base: FeatureValues
    per_batch: FeatureValues


#: The object-store meta header holding an ONNX model's `ModelFeatures`, as compact JSON (in
#: the object's meta, which readers of the bytes never parse; Go clients' `nats.Header` form:
#: a list of one string).
FEATURES_HEADER = "Mars-Features"
#: Longest header value read (the features of every model are a few KiB).
MAX_FEATURES_TEXT = 16 * 1024


def features_headers(features: ModelFeatures) -> dict[str, list[str]]:
    """The object meta headers that carry `features` (merged into any others it has)."""
    from schemas.codec import encode  # (schemas.codec imports this module's importers)

    return {FEATURES_HEADER: [encode(features, "json").decode()]}


def features_of_headers(headers: object) -> ModelFeatures | None:
    """The features an object's meta headers carry: None when they carry none; ValueError
    when they carry something that is not `ModelFeatures` (whoever wrote the meta)."""
    if headers is None:
        return None
    if not isinstance(headers, dict):
        raise ValueError(f"object meta headers are a {type(headers).__name__}, not a map")
    value = headers.get(FEATURES_HEADER)
    if value is None:
        return None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise ValueError(f"{FEATURES_HEADER} is not one string")
    if len(value) > MAX_FEATURES_TEXT:
        raise ValueError(f"{FEATURES_HEADER} is {len(value)} characters, over {MAX_FEATURES_TEXT}")
    from schemas.codec import DecodeError, decode

    try:
        return decode(value.encode(), ModelFeatures, "json")
    except DecodeError as exc:
        raise ValueError(f"{FEATURES_HEADER} does not read: {exc}") from exc


class ArtifactInfo(WireModel):
    """One name given to one artifact's bytes (the value of its key in the names bucket)."""

    name: Ident
    sha256: Sha256Hex
    size: Annotated[int, Field(ge=0, le=MAX_ARTIFACT_BYTES)]
    kind: ArtifactKind
    #: When it was put, on the putting host's wall clock (for people; nothing compares it).
    created: Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)]
    # No field may be added: agents and CLIs of every release since level 4 read entries
    # (the graph features of an ONNX model are in its object's meta: `features_headers`).

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.sha256}"


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    name: str
    sha256: str

    def __str__(self) -> str:
        return f"{self.name}@{self.sha256}"


def parse_ref(text: str) -> ArtifactRef | None:
    """`name@sha256` split in two; None for anything else (a built-in model, a file name)."""
    if _REF.fullmatch(text) is None:
        return None
    name, _, digest = text.partition("@")
    return ArtifactRef(name, digest)
