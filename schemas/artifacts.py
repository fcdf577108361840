"""Artifacts: ONNX models and Python bundles shipped to agents through the object store.

An artifact's bytes are stored once, under their sha256, in the object store
`subjects.ARTIFACTS_BUCKET`; the names people give them live in the KV bucket
`subjects.ARTIFACT_NAMES_BUCKET`, one key `<name>.<sha256>` per (name, content) holding an
`ArtifactInfo`. A task refers to one as `name@sha256`: the digest pins the bytes (an agent
verifies them before use), the name says which put it came from. `mars artifact put` and
`rm` talk to JetStream directly: no orchestrator holds the bytes or answers for them.
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


class ArtifactInfo(WireModel):
    """One name given to one artifact's bytes (the value of its key in the names bucket)."""

    name: Ident
    sha256: Sha256Hex
    size: Annotated[int, Field(ge=0, le=MAX_ARTIFACT_BYTES)]
    kind: ArtifactKind
    #: When it was put, on the putting host's wall clock (for people; nothing compares it).
    created: Annotated[float, Field(ge=0.0, le=1e11, allow_inf_nan=False)]
    #: An ONNX model's graph features (None: not an ONNX model, one its put could not parse,
    #: or put by a release before level 7).
    features: ModelFeatures | None = None

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
