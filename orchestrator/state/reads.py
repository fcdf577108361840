"""What a pipeline's tasks read from the object store before they run, by task: the bytes of
the pipeline inputs each binds and the artifact each names (sha256, size). Pure: the sizes of
artifacts are looked up at submission (`placement.store_reads.StoreLookup`); the plan charges
each task the fetch where it would run (`placement.planning.SpecCostModel`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from schemas.artifacts import parse_ref
from schemas.pipeline import PipelineSpec, artifact_of


@dataclass(frozen=True)
class StoreReads:
    """Per task: bytes of pipeline inputs it reads, and the artifact it needs (sha256, size)."""

    inputs: Mapping[str, int] = field(default_factory=dict)
    artifacts: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.inputs or self.artifacts)


def store_reads(spec: PipelineSpec, artifact_sizes: Mapping[str, int]) -> StoreReads:
    """The reads of `spec`'s tasks; an artifact of unknown size is not charged."""
    sizes = {i.name: i.size for i in spec.inputs}
    inputs: dict[str, int] = {}
    artifacts: dict[str, tuple[str, int]] = {}
    for t in spec.tasks:
        names = {b.pipeline_input for b in t.inputs if b.pipeline_input is not None}
        if total := sum(sizes.get(n, 0) for n in names):
            inputs[t.id] = total
        art = artifact_of(t.run)
        ref = parse_ref(art[0]) if art is not None else None
        if ref is not None and (size := artifact_sizes.get(ref.sha256)) is not None:
            artifacts[t.id] = (ref.sha256, size)
    return StoreReads(inputs, artifacts)
