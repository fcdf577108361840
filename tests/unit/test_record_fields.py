"""The pipeline record written on every change is built as plain values (`record_fields`),
not as models: for arbitrary runs it must be exactly what the models would encode, and valid
to the replica that reads it."""

from __future__ import annotations

import random
import typing

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.placement.placer import planned_view
from orchestrator.reliability.ownership import EXTRA_COUNTERS, from_record, record_fields
from orchestrator.scheduling import Placement
from orchestrator.state.pipelines import PipelineRun
from schemas.api import PipelineState, TaskState
from schemas.codec import decode, encode, encode_trusted
from schemas.failover import PipelineRecord, PlacedTask, TaskRecord, read_head
from sim.fleet import synthetic_pipeline

idents = st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)
texts = st.text(max_size=3000)  # the record trims where the schema bounds (reason)
seconds = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
maybe_seconds = st.none() | seconds


def reference(run: PipelineRun, **kw: typing.Any) -> PipelineRecord:
    """The record made of its models, as it was built before `record_fields`."""
    mono, wall = kw["mono"], kw["wall"]

    def on_wall(t: float | None) -> float | None:
        return None if t is None else max(0.0, wall - (mono - t))

    return PipelineRecord(
        pipeline_id=run.pipeline_id, name=run.spec.name, owner=run.owner[:256],
        epoch=kw["epoch"], state=run.state, reason=run.reason[:2048],
        algorithm=run.algorithm[:256], planned_makespan_s=max(0.0, run.planned_makespan_s),
        plan=run.plan,
        placements=[
            PlacedTask(task_id=t, device_id=p.device_id, slot=p.slot, start=p.start,
                       finish=p.finish)
            for t, p in run.placements.items()
        ],
        tasks=[
            TaskRecord(status=run.tasks[t.id].status(), token=run.tasks[t.id].token)
            for t in run.spec.tasks
        ],
        placement_log=list(run.placement_log),
        submitted_wall=run.submitted_wall or max(0.0, wall - (mono - run.submitted_at)),
        t0=run.t0, committed_wall=on_wall(run.committed_at),
        finished_wall=on_wall(run.finished_at), conflicts=run.conflicts,
        rejections=run.rejections, cas_retries=run.cas_retries,
        stale_events=run.stale_events, duplicate_events=run.duplicate_events,
        counters={c: int(getattr(run, c)) for c in EXTRA_COUNTERS if hasattr(run, c)},
        events_seq=kw["events_seq"], adoptions=kw["adoptions"], evictions=run.evictions,
        user=run.spec.user,
    )  # fmt: skip


@st.composite
def runs(draw: st.DrawFn) -> PipelineRun:
    rng = random.Random(draw(st.integers(0, 2**32)))
    spec = synthetic_pipeline(rng, "rec", tasks=draw(st.integers(1, 20)))
    spec = spec.model_copy(update={"user": draw(st.none() | idents)})  # whose (users.py)
    run = PipelineRun(
        draw(idents), spec, submitted_at=draw(seconds), state=draw(st.sampled_from(
            typing.get_args(PipelineState))),
        reason=draw(texts), algorithm=draw(st.text(max_size=300)),
        owner=draw(st.text(max_size=300)),
        planned_makespan_s=draw(st.floats(-10.0, 1e6)), submitted_wall=draw(seconds),
        t0=draw(seconds), committed_at=draw(maybe_seconds), finished_at=draw(maybe_seconds),
        conflicts=draw(st.integers(0, 99)), stale_events=draw(st.integers(0, 99)),
    )  # fmt: skip
    for t in spec.tasks:
        tr = run.tasks[t.id]
        tr.state = draw(st.sampled_from(typing.get_args(TaskState)))
        if draw(st.booleans()):
            tr.agent_id, tr.device_id = draw(idents), draw(idents)
            tr.token = draw(st.integers(1, 2**40))
            run.placements[t.id] = Placement(
                t.id,
                f"{tr.agent_id}:{tr.device_id}",
                draw(st.integers(0, 8)),
                draw(st.floats(-1e3, 1e6)),
                draw(st.floats(-1e3, 1e6)),
            )
        tr.started_s, tr.finished_s = draw(maybe_seconds), draw(maybe_seconds)
        tr.duration_s, tr.predicted_s = draw(maybe_seconds), draw(maybe_seconds)
        tr.output_bytes = draw(st.integers(0, 2**40))
        tr.result, tr.error = draw(st.text(max_size=256)), draw(st.text(max_size=2048))
        if draw(st.booleans()):
            run.evictions[t.id] = draw(st.integers(1, 1000))
    run.plan = planned_view(run.placements)
    for line in draw(st.lists(texts, max_size=3)):
        run.note(line)
    run.results_committed = draw(st.integers(0, 20))
    return run  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(run=runs(), epoch=st.integers(1, 2**40), seq=st.integers(0, 2**40), wall=seconds)
def test_the_record_is_what_its_models_encode(
    run: PipelineRun, epoch: int, seq: int, wall: float
) -> None:
    kw: dict[str, typing.Any] = {
        "epoch": epoch,
        "events_seq": seq,
        "adoptions": 1,
        "mono": 50.0,
        "wall": 1e9 + wall,
    }
    fields = record_fields(run, **kw)
    want = reference(run, **kw)
    assert encode_trusted(fields) == encode(want)  # byte for byte: field order and types
    assert decode(encode_trusted(fields), PipelineRecord) == want  # and valid when read
    assert PipelineRecord.model_validate(fields) == want
    # and read back by the replica that adopts it, what it must carry on from
    back = from_record(want, run.spec, owner="o", mono=50.0, wall=kw["wall"])
    assert back.evictions == run.evictions
    # whose it is: in the record `list` reads (its head) and in what an adopter resumes
    assert want.user == run.spec.user == back.spec.user
    assert read_head(encode_trusted(fields)).user == run.spec.user
