"""One instance, two encodings: our core's model and anrg-saga's related-machines model.

saga's model: compute time = cost / node speed; transfer time = size / link speed between two
nodes (infinite on the same node); no latency. We express the same thing in our core with every
device on its own agent and site and a zero-latency link per device pair, so both schedulers see
identical costs, and we check saga's schedules with our own `Plan.validate`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.scheduling import Cluster, Device, Link, LinkCostModel, Placement, Plan, Task
from orchestrator.scheduling import TaskGraph as CoreGraph

log = logging.getLogger("mars.bench")


@dataclass(frozen=True)
class Instance:
    name: str
    graph: CoreGraph
    cluster: Cluster
    cost: LinkCostModel
    #: bandwidth (bytes/s) between devices i < j, keyed by device ids
    bandwidth: Mapping[tuple[str, str], float]


def related_instance(
    name: str,
    graph: CoreGraph,
    speeds: Mapping[str, float],
    bandwidth: Callable[[str, str], float],
) -> Instance:
    """Build an instance where device `d` has speed speeds[d] and pair (a, b) link bandwidth."""
    ids = sorted(speeds)
    devices = [Device(id=d, agent_id=d, site=d, speed=speeds[d]) for d in ids]
    bw: dict[tuple[str, str], float] = {}
    links: dict[tuple[str, str], Link] = {}
    for i, a in enumerate(ids):
        for b in ids[i + 1 :]:
            v = bandwidth(a, b)
            bw[(a, b)] = v
            links[(a, b)] = Link(latency_s=0.0, bandwidth_Bps=v)
    # plain tasks: constraints are ours alone; saga knows none
    tasks = [Task(id=t.id, work=t.work) for t in graph]
    core = CoreGraph(tasks, dict(graph.edges))
    return Instance(name, core, Cluster(devices), LinkCostModel(links), bw)


def to_saga(inst: Instance) -> tuple[Any, Any]:
    """(saga Network, saga TaskGraph) for the instance."""
    import saga

    nodes = [(d.id, d.speed) for d in inst.cluster.devices]
    edges: list[tuple[str, str, float]] = [(d.id, d.id, math.inf) for d in inst.cluster.devices]
    edges += [(a, b, v) for (a, b), v in inst.bandwidth.items()]
    network = saga.Network.create(nodes, edges)
    tasks = [(t.id, t.work) for t in inst.graph]
    deps = [(s, d, b) for (s, d), b in inst.graph.edges.items()]
    logging.getLogger().setLevel(logging.ERROR)  # saga warns about adding super source/sink
    task_graph = saga.TaskGraph.create(tasks, deps)
    return network, task_graph


def saga_plan(schedule: Any, inst: Instance, algorithm: str) -> Plan:
    """saga's schedule as our Plan (dropping saga's zero-cost super source/sink)."""
    placements: dict[str, Placement] = {}
    for node, tasks in schedule.mapping.items():
        for st in tasks:
            if st.name in inst.graph:
                placements[st.name] = Placement(st.name, node, 0, float(st.start), float(st.end))
    return Plan(placements=placements, algorithm=algorithm)
