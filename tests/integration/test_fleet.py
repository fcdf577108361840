"""A fleet of emulated agents in one process joins a real orchestrator and runs a pipeline."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.service import Orchestrator
from sim.fleet import fleet_configs, run_fleet, synthetic_pipeline
from transport.client import Client

pytestmark = pytest.mark.integration

COUNT = 10


def test_fleet_configs_declare_one_emulated_device_each() -> None:
    configs = fleet_configs(COUNT, prefix="f", slots=3, gflops=20.0, site_count=4)
    assert len(configs) == COUNT
    assert {c.site for c in configs.values()} == {f"f-site-{k}" for k in range(4)}
    for cfg in configs.values():
        assert not cfg.probe_cpu
        (dev,) = cfg.devices
        assert dev.emulated and dev.kind == "cpu" and dev.slots == 3 and dev.gflops == 20.0
        assert {link.to_site for link in cfg.links} == {f"f-site-{k}" for k in range(4)} - {
            cfg.site
        }


def test_synthetic_pipeline_is_seeded_and_acyclic() -> None:
    a = synthetic_pipeline(random.Random(5), "p", tasks=(1, 12))
    b = synthetic_pipeline(random.Random(5), "p", tasks=(1, 12))
    assert a == b
    ids = [t.id for t in a.tasks]
    for i, t in enumerate(a.tasks):
        assert all(ids.index(d) < i for d in t.deps)


@pytest.mark.parametrize("shared", [False, True], ids=["own-connections", "shared-connection"])
async def test_fleet_joins_and_runs_a_pipeline(
    nats_server: EmbeddedNats, shared: bool, tmp_path: Path
) -> None:
    """Own connections: state under a directory we name (kept on stop); shared: the
    default temp directory per agent."""
    url = nats_server.url
    state = tmp_path / "state"
    orch = Orchestrator(url)
    await orch.start()
    stop = asyncio.Event()
    started = asyncio.Event()
    fleet = asyncio.create_task(
        run_fleet(
            url,
            COUNT,
            prefix="fleet",
            heartbeat_s=0.2,
            shared_connection=shared,
            state_dir=None if shared else str(state),
            stop=stop,
            started=started,
        )
    )
    client = await Client.connect(url)
    try:
        up = asyncio.create_task(started.wait())
        await asyncio.wait({up, fleet}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        up.cancel()
        assert started.is_set(), (
            f"fleet did not start: {fleet.exception() if fleet.done() else 'timeout'}"
        )
        assert await orch.wait_for_agents(COUNT, timeout=10.0) == COUNT
        listed = (await client.agents(alive_only=True)).agents
        assert len(listed) == COUNT
        assert all(d.endswith("(emulated)") for a in listed for d in a.devices)

        spec = synthetic_pipeline(random.Random(1), "fleet-smoke", tasks=6, seconds=(0.01, 0.01))
        reply = await client.submit(spec, pipeline_id="fleet-1")
        assert reply.state == "running"
        assert {p.task_id for p in reply.plan} == {t.id for t in spec.tasks}
        fleet_ids = {f"fleet-{i:04d}" for i in range(COUNT)}
        assert {p.agent_id for p in reply.plan} <= fleet_ids

        st = await client.wait(reply.pipeline_id, timeout=20)
        assert st.state == "succeeded", st.reason
        assert all(t.state == "succeeded" for t in st.tasks)
        assert {t.agent_id for t in st.tasks} <= fleet_ids
    finally:
        await client.close()
        stop.set()
        await asyncio.wait_for(fleet, 20)
        await orch.stop()
    if shared:
        assert not state.exists()
    else:  # each agent's journal (its lock at least) under state/<id>, kept for its next start
        assert {d.name for d in state.iterdir()} == fleet_ids
        assert all((state / a / "events.lock").exists() for a in fleet_ids)
