"""Pipelines: DAGs of tasks with what each needs and what each is expected to cost."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from schemas.agent import DeviceKind, Tier
from schemas.artifacts import ArtifactKind, ArtifactRefText, parse_ref
from schemas.base import WireModel
from schemas.limits import (
    MAX_DEPS,
    MAX_TASKS,
    Bytes,
    Ident,
    Labels,
    NonNegFloat,
    PosFloat,
    RelativeName,
    Seconds,
    ShortText,
)

Arg = Annotated[str, StringConstraints(max_length=4096)]
#: What the bytes of a value on the wire are: raw bytes, an `.npy` tensor, an `.npz` named set
#: of tensors, JSON, or UTF-8 text.
MediaType = Literal[
    "application/octet-stream",
    "application/x-npy",
    "application/x-npz",
    "application/json",
    "text/plain",
]
ScalarArg = Annotated[str, StringConstraints(max_length=4096)] | int | float | bool


class SyntheticRun(WireModel):
    """Sleep or spin; `seconds` is the time on a device of `ref_gflops` (fixed if None)."""

    kind: Literal["synthetic"] = "synthetic"
    mode: Literal["sleep", "busy"] = "sleep"
    seconds: Seconds = 0.1
    ref_gflops: PosFloat | None = None
    output_bytes: Annotated[int, Field(ge=0, le=1 << 30)] = 0


class OnnxRun(WireModel):
    """Run an ONNX model; `model` is a built-in model name, a file in the agent's models
    directory, or an artifact `name@sha256` (fetched and verified by the agent)."""

    kind: Literal["onnx"] = "onnx"
    model: RelativeName
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    batch: Annotated[int, Field(ge=1, le=4096)] = 1
    iterations: Annotated[int, Field(ge=1, le=10_000)] = 1
    seed: Annotated[int, Field(ge=0, le=2**31)] = 0
    #: Capped by the agent's `onnx_timeout_s`; past it the run is terminated and the task fails.
    timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 60.0
    #: Feed model inputs no upstream value is bound to with seeded random tensors of `batch`
    #: rows (benchmarks, sim); otherwise such an input is a task error.
    random_inputs: bool = False

    @model_validator(mode="after")
    def _one_digest(self) -> Self:
        ref = parse_ref(self.model)
        if ref is not None and self.sha256 is not None and self.sha256 != ref.sha256:
            raise ValueError(f"sha256 {self.sha256} is not the digest model {self.model} names")
        return self


class ExecRun(WireModel):
    """Run an allowlisted executable with these arguments (no shell), in a fresh working
    directory. Each input is a file there: `{in:NAME}` in an argument is its path, as is the
    environment variable `MARS_IN_NAME` (upper case, other characters `_`); `{out}` and
    `MARS_OUT` are the directory for output files. The output is stdout, or the file
    `output` the command wrote there."""

    kind: Literal["exec"] = "exec"
    argv: Annotated[list[Arg], Field(min_length=1, max_length=64)]
    timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 60.0
    output: Annotated[
        str, StringConstraints(pattern=r"^(stdout|[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$")
    ] = "stdout"


class PythonRun(WireModel):
    """Call `module:function(**kwargs, **inputs)` from an allowlisted module: each input by
    its name, decoded (an `.npy` tensor as an array, an `.npz` set as a dict of arrays, JSON
    as data, anything else as bytes). Its return value is the output: bytes as they are, an
    array as `.npy`, a dict of arrays as `.npz`, str as text, anything else as JSON."""

    kind: Literal["python"] = "python"
    entry: Annotated[
        str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=256)
    ]
    kwargs: Annotated[dict[Ident, ScalarArg], Field(max_length=64)] = Field(default_factory=dict)
    #: Capped by the agent's `python_timeout_s`.
    timeout_s: Annotated[float, Field(gt=0.0, le=86_400.0)] = 60.0
    #: Code shipped with the task: an artifact `name@sha256` (a zip or wheel) holding the
    #: module `entry` names, run only where the agent's owner allows shipped code.
    bundle: ArtifactRefText | None = None


RunSpec = Annotated[SyntheticRun | OnnxRun | ExecRun | PythonRun, Field(discriminator="kind")]


def artifact_of(run: RunSpec) -> tuple[str, ArtifactKind] | None:
    """The artifact a task's run names (its text and kind), if any."""
    if isinstance(run, OnnxRun) and parse_ref(run.model) is not None:
        return run.model, "onnx"
    if isinstance(run, PythonRun) and run.bundle is not None:
        return run.bundle, "python-bundle"
    return None


class Requirements(WireModel):
    kinds: Annotated[list[DeviceKind], Field(max_length=3)] = Field(default_factory=list)
    tiers: Annotated[list[Tier], Field(max_length=4)] = Field(default_factory=list)
    min_memory_mb: NonNegFloat = 0.0
    labels: Labels = Field(default_factory=dict)
    pinned_agent: Ident | None = None


class Profile(WireModel):
    """Features for the execution-time predictor; all optional."""

    flops: NonNegFloat = 0.0
    bytes_in: Bytes = 0
    params: Bytes = 0
    batch: Annotated[int, Field(ge=1, le=1 << 20)] = 1
    est_seconds: Seconds | None = None


class InputBinding(WireModel):
    """One input of a task: the output of `source` (one of its deps) or the pipeline's input
    `pipeline_input` (exactly one of them), or one `member` of it (a tensor of an `.npz` set, a
    key of a JSON object), under `name`: the ONNX model input, the exec file and variable, or
    the python keyword it is given as."""

    name: Ident
    source: Ident | None = None
    pipeline_input: Ident | None = None
    member: Ident | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.source is None) == (self.pipeline_input is None):
            raise ValueError(f"input {self.name}: name exactly one of source and pipeline_input")
        return self


class PipelineInput(WireModel):
    """A value the pipeline is given: stored once, before it is placed, in the object store
    bucket `MARS_INPUTS` under its sha256 (`mars submit --input NAME=PATH` does both)."""

    name: Ident
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size: Bytes
    media_type: MediaType | None = None


class TaskSpec(WireModel):
    id: Ident
    run: RunSpec
    #: Its inputs by name; empty: each dep's output under the dep's id.
    inputs: Annotated[list[InputBinding], Field(max_length=MAX_DEPS)] = Field(default_factory=list)
    #: What its output is (consumers decode it so); None: by its bytes (`.npy`/`.npz` are
    #: recognised, anything else is bytes).
    output_type: MediaType | None = None
    requires: Requirements = Field(default_factory=Requirements)
    profile: Profile = Field(default_factory=Profile)
    #: Declared size of this task's output, sent to each consumer.
    output_bytes: Bytes = 0
    deps: Annotated[list[Ident], Field(max_length=MAX_DEPS)] = Field(default_factory=list)
    #: False: once placed, adaptive re-scheduling never moves this task (state on a device,
    #: licensing, a pinned accelerator); recovery from a dead device still may.
    migratable: bool = True
    #: Keep its output in `MARS_OUTPUTS` for `mars get` (at the hub) even though other tasks
    #: take it; a task no other takes (a sink) is kept anyway. An intermediate output not
    #: asked for stays at its producer's site.
    keep_output: bool = False


class PipelineSpec(WireModel):
    name: Ident
    tasks: Annotated[list[TaskSpec], Field(min_length=1, max_length=MAX_TASKS)]
    #: Its inputs, by name; tasks take them through `InputBinding.pipeline_input`.
    inputs: Annotated[list[PipelineInput], Field(max_length=64)] = Field(default_factory=list)
    priority: Annotated[int, Field(ge=0, le=1000)] = 100
    preemptible: bool = False
    deadline_s: Seconds | None = None
    #: Most dollars its plan may cost (device $/hour over its tasks' run time, plus data
    #: crossing sites at each link's $/GB, as agents advertise them): the shortest plan within
    #: it is chosen, and a submission no plan fits is refused (`over_budget`). None: no limit.
    budget: PosFloat | None = None
    #: Seconds of makespan a dollar is worth: plans are ranked by makespan + money_weight x
    #: dollars. 0 (the default): time alone (within `budget`, if any).
    money_weight: NonNegFloat = 0.0
    description: ShortText = ""
    #: The user who submitted it (the token of the per-user API subject it came on:
    #: `mars.v1.api.submit.<user>`), set by the replica that took it; None: submitted on the
    #: admin's subject unnamed. Only that user sees and cancels it on their own subjects.
    user: Ident | None = None

    @model_validator(mode="after")
    def _check_dag(self) -> Self:
        ids = [t.id for t in self.tasks]
        known = set(ids)
        if len(known) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"duplicate task ids: {', '.join(dup[:10])}")
        indeg: dict[str, int] = {}
        children: dict[str, list[str]] = {i: [] for i in ids}
        for t in self.tasks:
            if len(set(t.deps)) != len(t.deps):
                raise ValueError(f"task {t.id} lists a dependency twice")
            names = [b.name for b in t.inputs]
            if len(set(names)) != len(names):
                raise ValueError(f"task {t.id} names an input twice")
            given = {i.name for i in self.inputs}
            for b in t.inputs:
                if b.pipeline_input is not None:
                    if b.pipeline_input not in given:
                        raise ValueError(
                            f"input {b.name} of task {t.id} is the pipeline input "
                            f"{b.pipeline_input}, which the pipeline is not given"
                        )
                    continue
                if b.source not in t.deps:
                    raise ValueError(
                        f"input {b.name} of task {t.id} comes from {b.source}, not one of its deps"
                    )
            for d in t.deps:
                if d not in known:
                    raise ValueError(f"task {t.id} depends on unknown task {d}")
                if d == t.id:
                    raise ValueError(f"task {t.id} depends on itself")
                children[d].append(t.id)
            indeg[t.id] = len(t.deps)
        ready = [i for i in ids if indeg[i] == 0]
        seen = 0
        while ready:
            n = ready.pop()
            seen += 1
            for c in children[n]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
        if seen != len(ids):
            cyc = sorted(i for i in ids if indeg[i] > 0)
            raise ValueError(f"dependency cycle among: {', '.join(cyc[:10])}")
        return self
