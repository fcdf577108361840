"""Bounds shared by every model: the wire must never carry something unbounded."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, StringConstraints

MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 32
MAX_CONTAINER_LEN = 10_000
MAX_STR_LEN = 64 * 1024
MAX_TASKS = 5_000
MAX_DEPS = 1_000
MAX_DEVICES = 64
MAX_LINKS = 512
#: Largest link-probe payload an agent accepts (larger ones get an error, never an echo).
MAX_PROBE_BYTES = 512 * 1024
MAX_LABELS = 32
MAX_INLINE_DATA = 1024 * 1024
#: Largest task output an agent keeps and ships (through the object store above the inline limit).
MAX_OUTPUT_BYTES = 256 * 1024 * 1024
MAX_SECONDS = 7 * 24 * 3600.0

#: Identifier safe inside a NATS subject token (no dots, spaces or wildcards).
Ident = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
#: Free human text (reasons, messages).
Text = Annotated[str, StringConstraints(max_length=2048)]
ShortText = Annotated[str, StringConstraints(max_length=256)]
Path = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


def _relative_inside(name: str) -> str:
    """A name that stays inside the directory it is looked up in (no absolute path, drive or
    `..`): a task names a model, never a file elsewhere on the agent."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0] or "\x00" in name:
        raise ValueError("must be relative to the agent's models directory, without '..'")
    return name


#: A file named relative to a directory of the agent's, that it cannot leave.
RelativeName = Annotated[
    str, StringConstraints(min_length=1, max_length=1024), AfterValidator(_relative_inside)
]
LabelKey = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9_./-]+$")
]
LabelValue = Annotated[str, StringConstraints(max_length=128)]
Labels = Annotated[dict[LabelKey, LabelValue], Field(max_length=MAX_LABELS)]

Seconds = Annotated[float, Field(ge=0.0, le=MAX_SECONDS, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0.0, le=1e18, allow_inf_nan=False)]
PosFloat = Annotated[float, Field(gt=0.0, le=1e18, allow_inf_nan=False)]
Bytes = Annotated[int, Field(ge=0, le=1 << 50)]
Count = Annotated[int, Field(ge=0, le=1 << 53)]
