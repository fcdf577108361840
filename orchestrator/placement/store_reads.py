"""What a pipeline's tasks read from the object store before they run: the pipeline inputs
they bind and the artifact (model or bundle) each names.

Looked up once, at submission: a pipeline naming an input or an artifact the store does not
hold is refused then, saying what is missing, instead of failing a task after it was
placed and booked. The sizes found are what the plan charges each task for the fetch on
the device it would run on (`planning.SpecCostModel`): pipeline inputs everywhere, an
artifact only where the agent does not advertise holding it.

An ONNX model's graph features (`mars artifact put` reads them) are in its object's meta in
`MARS_ARTIFACTS` (`schemas.artifacts.features_of_headers`): read by its sha256 once the
entry says the model is stored, and kept by digest (its bytes, so its features, never
change), they go into the predictor's feature book under the name tasks give the model
(`name@sha256`, as `Predictor.graph_of` looks it up), once per artifact, before the pipeline
is placed, so its tasks are scored by the learned model rather than the FLOPs prior. Meta that
does not read as features is passed over, said so in the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from nats.errors import Error as NatsError
from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from orchestrator.predictor.features import FeatureBook, GraphFeatures
from schemas import subjects
from schemas.artifacts import ArtifactInfo, ArtifactKind, features_of_headers, parse_ref
from schemas.codec import DecodeError, decode
from schemas.errors import ServiceError
from schemas.pipeline import PipelineSpec, artifact_of

log = logging.getLogger("mars.orchestrator.store")

#: Longest wait for the store's answers at submission; past it the pipeline is placed with
#: its artifacts' sizes unknown (charged nothing), and an agent says what is missing.
LOOKUP_S = 2.0
#: Longest wait for an object's meta (its graph features) at submission: past it the
#: pipeline is placed without them (asked again at the next submission naming it).
FEATURES_S = 0.5
#: How long a digest whose object's meta holds no features is not asked again (a later put
#: of the same model may add them).
NO_FEATURES_S = 60.0
#: Most digests remembered as holding no features (all forgotten past it).
NO_FEATURES_KEPT = 4096


class StoreLookup:
    """Checks submissions against the object store (bucket handles kept between them)."""

    def __init__(self, js: Any, book: FeatureBook | None = None) -> None:
        self.js = js
        #: Where models' graph features go (the predictor's book); None: not looked for.
        self.book = book
        #: The artifacts (`name@sha256`) whose features are in the book already: the bytes
        #: a ref pins never change, so neither do their features.
        self._featured: set[str] = set()
        #: Features read by sha256 (kept: content-addressed), and the digests whose meta held
        #: none, with when they may be asked again (monotonic).
        self._features: dict[str, tuple[GraphFeatures, GraphFeatures]] = {}
        self._none_until: dict[str, float] = {}
        self._inputs: Any = None
        self._names: Any = None
        self._objects: Any = None

    async def _bucket(self, attr: str, open_it: Any) -> Any:
        if getattr(self, attr) is None:
            try:
                setattr(self, attr, await open_it())
            except BucketNotFoundError:
                return None  # nothing was ever stored there (asked again next time)
        return getattr(self, attr)

    async def check(self, spec: PipelineSpec) -> dict[str, int]:
        """The size of each artifact `spec` names, by sha256; raises `not_found` naming every
        pipeline input and artifact the store does not hold (`invalid`: an artifact of
        another kind than its task runs)."""
        used = {b.pipeline_input for t in spec.tasks for b in t.inputs if b.pipeline_input}
        wanted = [i for i in spec.inputs if i.name in used]
        arts = {a for t in spec.tasks if (a := artifact_of(t.run)) is not None}
        if not wanted and not arts:
            return {}
        missing: dict[str, str] = {}
        sizes: dict[str, int] = {}
        try:
            async with asyncio.timeout(LOOKUP_S):
                if wanted:
                    b = await self._bucket(
                        "_inputs", lambda: self.js.object_store(subjects.INPUTS_BUCKET)
                    )
                    for given, why in zip(
                        wanted,
                        await asyncio.gather(*(self._input_problem(b, i.sha256, i.size)
                                               for i in wanted)),
                        strict=True,
                    ):  # fmt: skip
                        if why:
                            missing[f"input {given.name}"] = why
                if arts:
                    kv = await self._bucket(
                        "_names", lambda: self.js.key_value(subjects.ARTIFACT_NAMES_BUCKET)
                    )
                    for (text, _), (why, size) in zip(
                        sorted(arts),
                        await asyncio.gather(*(self._artifact(kv, t, k) for t, k in sorted(arts))),
                        strict=True,
                    ):
                        if why:
                            missing[f"artifact {text}"] = why
                        elif size is not None:
                            sizes[text.rpartition("@")[2]] = size
        except (TimeoutError, ConnectionError, OSError) as exc:
            log.warning("object store not answering at submission (%s): placed unchecked", exc)
            return sizes
        if missing:
            wrong_kind = all("its task needs" in w for w in missing.values())
            head = "; ".join(f"{what} {why}" for what, why in sorted(missing.items()))
            raise ServiceError("invalid" if wrong_kind else "not_found", head[:2000], missing)
        return sizes

    @staticmethod
    async def _input_problem(bucket: Any, sha: str, size: int) -> str:
        hint = "not in MARS_INPUTS: store it first (`mars submit --input NAME=PATH` does)"
        if bucket is None:
            return hint
        try:
            info = await bucket.get_info(sha)
        except NotFoundError:
            return hint
        if info.deleted:
            return hint
        if info.size != size:
            return f"is {info.size} B in MARS_INPUTS, the spec says {size} B"
        return ""

    async def _artifact(self, kv: Any, text: str, kind: ArtifactKind) -> tuple[str, int | None]:
        ref = parse_ref(text)
        if ref is None:  # (artifact_of names refs only)
            return "", None
        hint = "not stored: `mars artifact put FILE` first (`mars artifact ls` lists them)"
        if kv is None:
            return hint, None
        try:
            entry = await kv.get(subjects.artifact_key(ref.name, ref.sha256))
        except KeyNotFoundError:
            return hint, None
        if entry.value is None:
            return hint, None
        try:
            info = decode(entry.value, ArtifactInfo)
        except DecodeError:
            return "", None  # unreadable: the agent that fetches it says why
        if info.kind != kind:
            return f"is of kind {info.kind}, its task needs {kind}", None
        if info.kind == "onnx":
            await self._learn(text, info)
        return "", info.size

    async def _learn(self, text: str, info: ArtifactInfo) -> None:
        """The model's graph features into the predictor's book (once per artifact)."""
        if self.book is None or text in self._featured:
            return
        got = await self._features_of(info.sha256)
        if got is None:
            return
        self.book.add(text, got[0], got[1], info.sha256)
        self._featured.add(text)

    async def _features_of(self, sha: str) -> tuple[GraphFeatures, GraphFeatures] | None:
        """The features in the meta of the object stored under `sha` (by digest, kept)."""
        if sha in self._features:
            return self._features[sha]
        now = time.monotonic()
        if self._none_until.get(sha, 0.0) > now:
            return None
        try:
            async with asyncio.timeout(FEATURES_S):
                objects = await self._bucket(
                    "_objects", lambda: self.js.object_store(subjects.ARTIFACTS_BUCKET)
                )
                meta = None if objects is None else await objects.get_info(sha)
        except NotFoundError:
            meta = None
        except (ConnectionError, OSError, NatsError) as exc:  # asked again next submission
            log.warning("artifact %s: its object's meta not read (%s)", sha, exc)
            return None
        try:
            f = None if meta is None else features_of_headers(meta.headers)
        except ValueError as exc:
            log.warning("artifact %s: its object's meta holds no graph features that read: %s",
                        sha, str(exc)[:300])  # fmt: skip
            f = None
        if f is None:
            if len(self._none_until) >= NO_FEATURES_KEPT:
                self._none_until.clear()
            self._none_until[sha] = now + NO_FEATURES_S
            return None
        got = self._features[sha] = (GraphFeatures.of(f.base), GraphFeatures.of(f.per_batch))
        return got
