"""Workflows generated from WfCommons recipes, for planning comparisons beyond the traces.

The shared WfInstances are a handful of real executions; WfCommons' recipes (WfChef) generate
workflows of any size with the structure and the runtime and file-size distributions of nine
real applications. Generation draws from Python's and numpy's global generators, so each
workflow is built under a fixed seed and the same arguments give the same graph.

`recipe_workflow` returns our TaskGraph: work is the task's runtime in seconds, an edge's
bytes those of the files the child reads from the parent (as `sim.workloads.wfcommons`).
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

import numpy as np

from orchestrator.scheduling import TaskGraph
from sim.workloads.wfcommons import parse_wfinstance

#: Applications with a WfChef recipe in wfcommons (name -> recipe class name).
RECIPES = {
    "1000genome": "GenomeRecipe",
    "blast": "BlastRecipe",
    "bwa": "BwaRecipe",
    "cycles": "CyclesRecipe",
    "epigenomics": "EpigenomicsRecipe",
    "montage": "MontageRecipe",
    "seismology": "SeismologyRecipe",
    "soykb": "SoykbRecipe",
    "srasearch": "SrasearchRecipe",
}


def recipe_workflow(app: str, tasks: int, seed: int = 0) -> TaskGraph:
    """A `app` workflow of about `tasks` tasks (recipes round to their structure), fixed by
    `seed`. Needs the `wfcommons` package (installed with the bench extra's anrg-saga)."""
    from wfcommons import WorkflowGenerator
    from wfcommons.wfchef import recipes

    recipe = getattr(recipes, RECIPES[app])
    state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        wf = WorkflowGenerator(recipe.from_num_tasks(tasks)).build_workflow()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "wf.json"
            wf.write_json(path)
            doc = json.loads(path.read_text())
    finally:
        random.setstate(state)
        np.random.set_state(np_state)
    return parse_wfinstance(doc, f"{app}-{tasks}").graph


def with_ccr(graph: TaskGraph, ccr: float, mean_speed: float, bandwidth: float) -> TaskGraph:
    """The graph with edge bytes scaled so that mean transfer time / mean compute time = `ccr`
    on devices of `mean_speed` and links of `bandwidth` (as random DAG generators set CCR);
    a graph without bytes gets them in proportion to its producers' work."""
    n_e = len(graph.edges)
    if not n_e:
        return graph
    comp = sum(t.work for t in graph) / len(graph) / mean_speed
    weights = dict(graph.edges)
    if not any(weights.values()):
        work = {t.id: t.work for t in graph}
        weights = {e: work[e[0]] or 1.0 for e in weights}
    mean_b = sum(weights.values()) / n_e
    factor = ccr * comp * bandwidth / mean_b if mean_b > 0 else 0.0
    return TaskGraph(list(graph), {e: b * factor for e, b in weights.items()})
