"""Workloads to schedule: random DAGs and clusters, real WfCommons workflows, edge pipelines.

All pure and deterministic per seed; nothing here talks to the network or the bus.
"""

from sim.workloads.apps import PIPELINES, ar_offload, sensor_fusion, video_analytics
from sim.workloads.random_dag import random_cluster, random_dag
from sim.workloads.tiered import TIERS, tiered_cluster
from sim.workloads.wfcommons import (
    Workflow,
    load_wfinstance,
    parse_wfinstance,
    wfinstance_dir,
    wfinstance_paths,
)

__all__ = [
    "PIPELINES",
    "TIERS",
    "Workflow",
    "ar_offload",
    "load_wfinstance",
    "parse_wfinstance",
    "random_cluster",
    "random_dag",
    "sensor_fusion",
    "tiered_cluster",
    "video_analytics",
    "wfinstance_dir",
    "wfinstance_paths",
]
