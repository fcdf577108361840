"""History first, on real runs: a real agent runs a real ONNX model again and again over a real
nats-server; its end events say the model's load apart from the run time, and after a few runs
the orchestrator predicts the task on that device within 5 % of the warm time it reported."""

from __future__ import annotations

import asyncio
import functools
import statistics

import nats
import pytest
from nats.aio.msg import Msg

from edge_agent.core import Job
from orchestrator.placement.planning import plan_pipeline
from orchestrator.predictor.correction import HISTORY_MIN, robust_centre
from orchestrator.predictor.model import task_signature
from schemas import PipelineSpec, subjects
from schemas.codec import decode, encoding_of
from schemas.events import TaskEvent
from tests.harness import EMULATED_CPU, RecordingAgent, agent_config, start_cluster, stop_cluster

pytestmark = pytest.mark.integration

RUNS = 5
#: ~10 ms of model runs per task on this host: long enough to time, short enough to repeat.
TASK = {"id": "cnn", "run": {"kind": "onnx", "model": "tiny_cnn", "batch": 64,
                             "iterations": 5, "random_inputs": True}}  # fmt: skip


async def succeeded(ends: asyncio.Queue[TaskEvent], msg: Msg) -> None:
    """Every task event's success, in the order heard."""
    ev = decode(msg.data, TaskEvent, encoding_of(msg.headers))
    if ev.state == "succeeded":
        ends.put_nowait(ev)


async def test_after_five_real_runs_the_prediction_is_the_warm_run_time(nats_url: str) -> None:
    configs = {"a1": agent_config("s1", "edge", probe_cpu=False, devices=[EMULATED_CPU])}
    orch, agents = await start_cluster(nats_url, configs)
    nc = await nats.connect(nats_url)
    ends: asyncio.Queue[TaskEvent] = asyncio.Queue()
    sub = await nc.subscribe(subjects.ALL_TASK_EVENTS, cb=functools.partial(succeeded, ends))
    try:
        spec = PipelineSpec.model_validate({"name": "rep", "tasks": [TASK]})
        task, key = spec.tasks[0], "a1:cpu0"
        _, device = orch.view.device_spec(key)
        sig = task_signature(task)

        def observed(runs: int) -> bool:
            """Whether the orchestrator has learned from this many runs."""
            tr = orch.predictor.corrections.get(sig, key)
            return tr is not None and tr.cold_n + len(tr.warm) >= runs

        got: list[TaskEvent] = []
        errors: list[float] = []
        for i in range(RUNS):
            pid = f"rep{i}"
            await orch.submit_spec(spec, pid)
            run = await orch.wait_terminal(pid, 60.0)
            assert run.state == "succeeded", (run.reason, run.placement_log)
            ev = await asyncio.wait_for(ends.get(), 10.0)
            assert ev.pipeline_id == pid
            got.append(ev)
            async with asyncio.timeout(10.0), orch.changed:  # the orchestrator learned it
                await orch.changed.wait_for(functools.partial(observed, i + 1))
            warm = [e.duration_s for e in got if e.cold is False and e.duration_s is not None]
            if warm:
                predicted = float(orch.predictor.estimate([task], [device], [key]).seconds[0, 0])
                errors.append(abs(predicted - statistics.median(warm)) / statistics.median(warm))
        print(
            f"runs (s): {[(e.duration_s, e.load_s, e.cold) for e in got]}; prediction's error "
            f"against the warm runs' median after each run from the second: {errors}"
        )

        first, *later = got
        # the first run made the session: said cold, with its load apart and not in its time
        assert first.cold is True and first.load_s is not None and first.load_s > 0.0
        (agent,) = agents
        assert isinstance(agent, RecordingAgent)
        (start, end) = next((s, e) for p, t, _, s, e in agent.log if p == "rep0")
        assert first.duration_s is not None
        assert first.duration_s + first.load_s <= end - start
        # later runs found it ready
        assert all(e.cold is False and e.load_s == 0.0 for e in later)
        warm = [e.duration_s for e in later if e.duration_s is not None]
        assert len(warm) == RUNS - 1
        est = orch.predictor.estimate([task], [device], [key])
        assert est.source_name(0, 0) == "history"
        # the warm runs' lower quartile: between the fastest and the median of what the agent
        # reported (a cold run mixed in would lift it above their median), whatever the
        # host's load did to their spread
        got_s = float(est.seconds[0, 0])
        assert min(warm) <= got_s <= statistics.median(warm), (got_s, warm)
        assert got_s == pytest.approx(robust_centre(warm), rel=1e-9)
        assert orch.predictor.load_estimate(task, key) == pytest.approx(first.load_s)
    finally:
        await sub.unsubscribe()
        await nc.close()
        await stop_cluster(orch, agents)


async def test_after_a_real_run_the_model_is_warm_there_and_its_load_charged_elsewhere(
    nats_url: str,
) -> None:
    """Two alike agents; the task runs on a1 once (pinned). a1 then advertises the model warm
    (`warm_models`, sent as its session is made), and the orchestrator's cost for the task on
    a1 is its run time alone, while on a2 it is that plus the model's load; unpinned, the
    next run goes to a1 and finds the session ready."""
    configs = {
        aid: agent_config("s1", "edge", probe_cpu=False, devices=[EMULATED_CPU])
        for aid in ("a1", "a2")
    }
    orch, agents = await start_cluster(nats_url, configs)
    try:
        assert all(orch.view.agents[a].advert.warm_models == [] for a in configs)
        pinned = {**TASK, "requires": {"pinned_agent": "a1"}}
        first = PipelineSpec.model_validate({"name": "warm", "tasks": [pinned]})
        await orch.submit_spec(first, "warm0")
        run = await orch.wait_terminal("warm0", 60.0)
        assert run.state == "succeeded", (run.reason, run.placement_log)
        assert run.tasks["cnn"].agent_id == "a1"
        async with asyncio.timeout(10.0):  # a1's advert saying so reaches the orchestrator
            while orch.view.agents["a1"].advert.warm_models != ["tiny_cnn"]:
                orch.cluster_changed.clear()
                await orch.cluster_changed.wait()
        assert orch.view.agents["a2"].advert.warm_models == []

        spec = PipelineSpec.model_validate({"name": "warm", "tasks": [TASK]})
        task = spec.tasks[0]
        planned = plan_pipeline(spec, orch.view, orch.mono(), predictor=orch.predictor)
        cost, devices = planned.cost, {d.id: d for d in planned.cluster.devices}
        (node,) = planned.graph.tasks
        run_a1 = cost.estimate("cnn", "a1:cpu0")[0]
        run_a2 = cost.estimate("cnn", "a2:cpu0")[0]
        assert run_a1 == run_a2  # alike devices; the cold run taught the estimate nothing
        loaded = orch.predictor.load_estimate(task, "a1:cpu0")
        assert loaded is not None and loaded > 0.0  # reported by a1's first (cold) run
        assert orch.predictor.load_estimate(task, "a2:cpu0") is None
        assert cost.compute_time(node, devices["a1:cpu0"]) == run_a1
        assert cost.compute_time(node, devices["a2:cpu0"]) == (
            run_a2 + orch.predictor.load_prior(task)
        )
        assert planned.plan.placements["cnn"].device_id == "a1:cpu0"

        await orch.submit_spec(spec, "warm1")
        run = await orch.wait_terminal("warm1", 60.0)
        assert run.state == "succeeded", (run.reason, run.placement_log)
        assert run.tasks["cnn"].agent_id == "a1"
        sig = task_signature(task)

        def learned() -> bool:
            tr = orch.predictor.corrections.get(sig, "a1:cpu0")
            return tr is not None and tr.cold_n + len(tr.warm) == 2

        async with asyncio.timeout(10.0), orch.changed:
            await orch.changed.wait_for(learned)
        track = orch.predictor.corrections.get(sig, "a1:cpu0")
        assert track is not None and (track.cold_n, len(track.warm)) == (1, 1)  # found warm
    finally:
        await stop_cluster(orch, agents)


async def test_runs_that_shared_the_agent_stay_out_of_the_warm_history(nats_url: str) -> None:
    """One agent, one device with 2 slots. The task runs alone until its warm history is the
    estimate; then two copies of it run at the same time (held at their start until both have
    begun: no sleep): each end event says it shared the agent with one other job, and the
    warm history and factor stay as they were, the runs kept apart as contention. A run alone
    after them enters the history again."""
    two_slots = {**EMULATED_CPU, "slots": 2}
    configs = {"a1": agent_config("s1", "edge", probe_cpu=False, devices=[two_slots])}
    orch, agents = await start_cluster(nats_url, configs)
    (agent,) = agents
    assert isinstance(agent, RecordingAgent)
    nc = await nats.connect(nats_url)
    ends: asyncio.Queue[TaskEvent] = asyncio.Queue()
    sub = await nc.subscribe(subjects.ALL_TASK_EVENTS, cb=functools.partial(succeeded, ends))
    try:
        alone = PipelineSpec.model_validate({"name": "alone", "tasks": [TASK]})
        task, key = alone.tasks[0], "a1:cpu0"
        sig = task_signature(task)

        def seen() -> int:
            tr = orch.predictor.corrections.get(sig, key)
            return 0 if tr is None else tr.cold_n + len(tr.warm) + tr.contended_n

        async def run(spec: PipelineSpec, pid: str, learned: int) -> list[TaskEvent]:
            await orch.submit_spec(spec, pid)
            done = await orch.wait_terminal(pid, 60.0)
            assert done.state == "succeeded", (done.reason, done.placement_log)
            got = [await asyncio.wait_for(ends.get(), 10.0) for _ in spec.tasks]
            assert {e.pipeline_id for e in got} == {pid}
            async with asyncio.timeout(10.0), orch.changed:  # the orchestrator learned them
                await orch.changed.wait_for(lambda: seen() == learned)
            return got

        for i in range(HISTORY_MIN + 1):  # a cold first run, then enough warm ones
            (ev,) = await run(alone, f"alone{i}", i + 1)
            assert (ev.shared, ev.cold) == (0, i == 0)
        track = orch.predictor.corrections.get(sig, key)
        assert track is not None and len(track.warm) == HISTORY_MIN and track.warm_s > 0.0
        before = (track.warm, track.warm_s, track.log_factor, track.n, track.recent)
        assert (track.contended_n, orch.predictor.contention(task, key)) == (0, None)

        both = asyncio.Event()
        begun: list[str] = []

        async def together(job: Job) -> None:
            """Each of the pair waits at its start until the other has begun too."""
            begun.append(job.offer.task.id)
            if len(begun) == 2:
                both.set()
            await both.wait()

        agent.before_run = together
        twin = {**TASK, "id": "cnn2"}
        pair = PipelineSpec.model_validate({"name": "pair", "tasks": [TASK, twin]})
        assert task_signature(pair.tasks[1]) == sig  # the same work: one track
        got = await run(pair, "pair", HISTORY_MIN + 3)
        agent.before_run = None
        assert sorted(begun) == ["cnn", "cnn2"]
        assert [(e.shared, e.cold) for e in got] == [(1, False), (1, False)]
        (s1, e1), (s2, e2) = [(s, e) for p, _, _, s, e in agent.log if p == "pair"]
        assert s1 < e2 and s2 < e1  # they did run at the same time
        assert (track.warm, track.warm_s, track.log_factor, track.n, track.recent) == before
        assert track.contended_n == 2
        ratios = [e.duration_s / before[1] for e in got if e.duration_s is not None]
        assert len(ratios) == 2
        assert orch.predictor.contention(task, key) == pytest.approx(statistics.median(ratios))

        (ev,) = await run(alone, "alone-after", HISTORY_MIN + 4)  # alone again: it counts
        assert ev.shared == 0 and ev.duration_s is not None
        assert track.warm == (*before[0], ev.duration_s) and track.contended_n == 2
    finally:
        await sub.unsubscribe()
        await nc.close()
        await stop_cluster(orch, agents)
