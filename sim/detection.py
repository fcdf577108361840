"""How long it takes to notice a dead node: labelled models, not measurements.

Why a model: the simulator cannot run a real control plane, yet recovery time is dominated by
detection, so the assumption must be explicit, parameterised and reported beside the result.

- `heartbeat`: MARS agents heartbeat every `interval_s` (default 0.5 s, `edge_agent.config`)
  and the orchestrator's `ClusterView` counts an agent dead after `misses` (3) intervals of
  silence. The last beat came a uniform fraction of an interval before the crash, so the
  delay is uniform in [(misses - 1) x interval, misses x interval] = [1.0, 1.5] s, plus up to
  `sweep_s` until the next liveness check looks.
- `kubernetes`: kubelet posts node status every 10 s (node-status-update-frequency); the node
  controller checks every 5 s (node-monitor-period) and marks the node NotReady after 40 s of
  silence (node-monitor-grace-period; 50 s from Kubernetes 1.32); pods are then evicted after
  the default 300 s NoExecute toleration (DefaultTolerationSeconds admission plugin) and only
  then rescheduled. Sources: kube-controller-manager and kubelet reference docs, "Taints and
  Tolerations" (taint-based evictions). Delay = 40 - U x 10 + U' x 5 + 300 s, i.e. 330-345 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Detection:
    """Delay from crash to the control plane acting on it:
    `timeout_s - U x beat_s + U' x sweep_s + extra_s`, with U, U' uniform in [0, 1)."""

    name: str
    timeout_s: float
    beat_s: float = 0.0
    sweep_s: float = 0.0
    extra_s: float = 0.0
    source: str = ""
    short: str = ""
    """A few words for a table's detection column (default: the name)."""

    def sample(self, rng: np.random.Generator) -> float:
        u, v = float(rng.random()), float(rng.random())
        return max(0.0, self.timeout_s - u * self.beat_s + v * self.sweep_s + self.extra_s)

    @property
    def worst_s(self) -> float:
        return self.timeout_s + self.sweep_s + self.extra_s

    @property
    def best_s(self) -> float:
        return max(0.0, self.timeout_s - self.beat_s + self.extra_s)

    def describe(self) -> str:
        return f"{self.name}: {self.best_s:g}-{self.worst_s:g} s ({self.source})"

    @property
    def label(self) -> str:
        """Short name and range, e.g. `heartbeat 1-1.5 s`."""
        return f"{self.short or self.name} ({self.best_s:g}-{self.worst_s:g} s)"


def heartbeat(interval_s: float = 0.5, misses: int = 3, sweep_s: float = 0.0) -> Detection:
    """MARS: dead after `misses` silent heartbeat intervals (see the module doc)."""
    return Detection(
        name=f"heartbeat {interval_s:g} s x {misses} misses",
        timeout_s=interval_s * misses,
        beat_s=interval_s,
        sweep_s=sweep_s,
        short=f"heartbeat {interval_s:g} s x {misses}",
        source="MARS ClusterView: agent dead after misses x heartbeat_interval_s of silence",
    )


def kubernetes(grace_s: float = 40.0, eviction_s: float = 300.0) -> Detection:
    """Kubernetes defaults: NotReady after the grace period, pods evicted after the
    toleration (see the module doc)."""
    return Detection(
        name=f"kubernetes-like: {grace_s:g} s grace + {eviction_s:g} s eviction",
        timeout_s=grace_s,
        beat_s=10.0,
        sweep_s=5.0,
        extra_s=eviction_s,
        short=f"k8s {grace_s:g} s grace + {eviction_s:g} s toleration",
        source=(
            "kubelet node-status-update-frequency 10 s, node-monitor-period 5 s, "
            "node-monitor-grace-period 40 s, default NoExecute toleration 300 s"
        ),
    )


HEARTBEAT = heartbeat()
KUBERNETES = kubernetes()
