"""Presence settings: every server config MARS writes pings its clients as `schemas.presence`
says, heartbeats are a backstop, and a connection closed for silence is a death of its own
cause."""

from __future__ import annotations

from pathlib import Path

from edge_agent.config import AgentConfig
from orchestrator.infra.natsserver import ACCOUNTS_CONF
from orchestrator.reliability.health import HealthTracker, Recover, Transition
from schemas.advisories import STALE_CONNECTION, ConnectionAdvisory
from schemas.codec import decode
from schemas.presence import DEFAULT_HEARTBEAT_S, PING_CONF, PING_INTERVAL, PING_MAX

REPO = Path(__file__).resolve().parents[2]


def test_every_server_config_mars_ships_pings_its_clients() -> None:
    assert ACCOUNTS_CONF.startswith(PING_CONF)
    shipped = (REPO / "deploy" / "nats" / "single.conf").read_text().splitlines()
    assert f'ping_interval: "{PING_INTERVAL}"' in shipped
    assert f"ping_max: {PING_MAX}" in shipped


def test_heartbeats_are_a_sparse_backstop() -> None:
    assert AgentConfig().heartbeat_interval_s == DEFAULT_HEARTBEAT_S >= 5.0


def test_a_connection_closed_for_silence_is_a_death_caused_by_silence() -> None:
    raw = b'{"client": {"id": 7, "name": "mars-agent-a"}, "reason": "Stale Connection"}'
    assert decode(raw, ConnectionAdvisory, "json").reason == STALE_CONNECTION
    h = HealthTracker(3)
    h.join("a", "inc1", DEFAULT_HEARTBEAT_S, 0.0)
    eff = h.disconnected("a", None, 1.0, "silent")
    assert [(e.new, e.cause) for e in eff if isinstance(e, Transition)] == [("dead", "silent")]
    assert [(e.cause, e.at) for e in eff if isinstance(e, Recover)] == [("silent", 1.0)]


def test_after_the_observer_reconnects_a_sparse_heartbeat_has_a_whole_window() -> None:
    h = HealthTracker(3)
    h.join("a", "inc1", DEFAULT_HEARTBEAT_S, 0.0)
    h.observer_lost()
    h.observer_back(100.0, 10.0)  # a grace shorter than the agent's window of 3 beats
    # its next beat may be most of an interval away: not suspect, let alone dead, by then
    assert h.tick(100.0 + DEFAULT_HEARTBEAT_S + 1.0) == []
    assert h.state("a") == "alive"
    eff = h.tick(100.0 + 3 * DEFAULT_HEARTBEAT_S + 0.1)
    assert [(e.new, e.cause) for e in eff if isinstance(e, Transition)] == [
        ("suspect", "heartbeat"),
        ("dead", "heartbeat"),
    ]


def sparse_fleet(n: int) -> HealthTracker:
    h = HealthTracker(3)
    for i in range(n):
        h.join(f"a{i}", "inc1", DEFAULT_HEARTBEAT_S, 0.0)
    return h


def test_crashes_seconds_apart_are_not_a_partition_with_sparse_heartbeats() -> None:
    h = sparse_fleet(5)
    # three unrelated crashes a few seconds apart: each recovered at once, nothing held
    for i, at in enumerate((1.0, 4.0, 7.0)):
        eff = h.disconnected(f"a{i}", None, at)
        assert [e.agent_id for e in eff if isinstance(e, Recover)] == [f"a{i}"]
    assert not h.partitioned


def test_connections_a_partition_closes_together_are_held() -> None:
    h = sparse_fleet(5)
    # the server closes a cut-off site's silent connections within a ping interval
    recovered = []
    for i, at in enumerate((1.0, 1.2, 1.4, 1.6)):
        eff = h.disconnected(f"a{i}", None, at, "silent")
        recovered += [e.agent_id for e in eff if isinstance(e, Recover)]
    assert h.partitioned
    assert recovered == ["a0", "a1"]  # before the count reached flood_min (docs/recovery.md)
