"""The liveness state machine: alive -> suspect -> dead, advisories, incarnations, partitions."""

from __future__ import annotations

import math

from orchestrator.reliability.health import Effect, HealthTracker, Partition, Recover, Transition

I = 0.5  # heartbeat interval  # noqa: E741


def transitions(effects: list[Effect]) -> list[tuple[str, str, str]]:
    return [(e.agent_id, e.new, e.cause) for e in effects if isinstance(e, Transition)]


def recovered(effects: list[Effect]) -> list[str]:
    return [e.agent_id for e in effects if isinstance(e, Recover)]


def fleet(n: int, **kw: float) -> HealthTracker:
    h = HealthTracker(3, **kw)  # type: ignore[arg-type]
    for i in range(n):
        h.join(f"a{i}", "inc1", I, 0.0)
    return h


def test_silence_goes_suspect_after_an_interval_and_dead_after_misses() -> None:
    h = fleet(10)
    for i in range(1, 10):
        h.beat(f"a{i}", "inc1", 1.4)
    assert h.tick(0.7) == []  # a heartbeat a little late is not missed yet
    assert h.next_check() == 1.5 * I
    assert transitions(h.tick(0.76)) == [("a0", "suspect", "heartbeat")]
    assert h.next_check() == 3 * I  # the next thing due: a0's death
    assert h.tick(1.5) == []
    eff = h.tick(1.51)
    assert transitions(eff) == [("a0", "dead", "heartbeat")]
    assert recovered(eff) == ["a0"]
    rec = next(e for e in eff if isinstance(e, Recover))
    assert rec.last_seen == 0.0 and rec.at == 1.51
    assert h.is_dead("a0")
    assert ("a0", "dead", "heartbeat") not in transitions(h.tick(5.0))  # dead once, and stays


def test_a_heartbeat_clears_suspicion_without_recovery() -> None:
    h = fleet(3)
    h.tick(0.8)
    assert h.state("a1") == "suspect"
    eff = h.beat("a1", "inc1", 0.9)
    assert transitions(eff) == [("a1", "alive", "heartbeat")]
    assert recovered(eff) == []


def test_disconnect_advisory_is_death_at_once_and_only_once() -> None:
    h = fleet(5)
    eff = h.disconnected("a2", None, 0.1)
    assert transitions(eff) == [("a2", "dead", "disconnect")]
    assert recovered(eff) == ["a2"]
    assert h.disconnected("a2", None, 0.2) == []
    assert h.disconnected("nobody", None, 0.2) == []
    # an advisory for another incarnation (an older connection) is ignored
    assert h.disconnected("a3", "inc0", 0.2) == []


def test_stale_incarnation_heartbeats_are_ignored_and_a_new_one_kills_the_old() -> None:
    h = fleet(4)
    assert h.beat("a1", "inc0", 0.3) == []
    eff = h.join("a1", "inc2", I, 0.4)
    assert transitions(eff) == [("a1", "dead", "new_incarnation")]
    assert recovered(eff) == ["a1"]
    assert h.state("a1") == "alive" and h.members["a1"].incarnation == "inc2"
    assert h.beat("a1", "inc1", 0.45) == []  # the dead incarnation stays dead


def test_same_incarnation_returning_after_death_rejoins() -> None:
    h = fleet(4)
    h.disconnected("a0", None, 0.1)
    eff = h.beat("a0", "inc1", 2.0)
    assert transitions(eff) == [("a0", "alive", "rejoined")]
    assert recovered(eff) == []


def test_a_flood_of_losses_pauses_recovery_until_heartbeats_return() -> None:
    h = fleet(10)
    alive = [f"a{i}" for i in range(4, 10)]
    for t in (0.4, 0.8, 1.2):
        for a in alive:
            h.beat(a, "inc1", t)
    assert len(transitions(h.tick(0.8))) == 4  # a0..a3 suspect together
    eff = h.tick(1.6)
    starts = [e for e in eff if isinstance(e, Partition)]
    assert starts and starts[0].started
    assert set(starts[0].agents) == {"a0", "a1", "a2", "a3"}
    assert recovered(eff) == []  # held, not stampeded
    assert h.partitioned and h.next_check() <= 1.6 + h.partition_timeout_s
    # three come back; nothing is moved for them
    eff = []
    for a in ("a0", "a1", "a2"):
        eff += h.beat(a, "inc1", 2.0)
    assert transitions(eff) == [(a, "alive", "rejoined") for a in ("a0", "a1", "a2")]
    assert recovered(eff) == [] and h.partitioned
    # the fourth stays silent for a detection window after the last return: really dead
    for a in [*alive, "a0", "a1", "a2"]:
        h.beat(a, "inc1", 3.4)
    assert h.next_check() == 2.0 + 3 * I
    eff = h.tick(3.5)
    ends = [e for e in eff if isinstance(e, Partition)]
    assert ends and not ends[0].started and ends[0].cause == "heartbeats_returned"
    assert ends[0].agents == ("a3",)
    assert recovered(eff) == ["a3"]
    assert not h.partitioned


def test_a_partition_ends_at_once_when_every_held_agent_is_back() -> None:
    h = fleet(4)
    h.tick(2.0)
    assert h.partitioned
    eff: list[Effect] = []
    for i in range(4):
        eff += h.beat(f"a{i}", "inc1", 2.5)
    assert [e.cause for e in eff if isinstance(e, Partition)] == ["heartbeats_returned"]
    assert recovered(eff) == [] and not h.partitioned


def test_a_partition_that_does_not_heal_is_released_after_the_timeout() -> None:
    h = fleet(4, partition_timeout_s=10.0)
    eff = h.tick(2.0)
    assert any(isinstance(e, Partition) and e.started for e in eff)
    assert recovered(eff) == []
    assert recovered(h.tick(11.0)) == []
    eff = h.tick(12.0)
    assert [e.cause for e in eff if isinstance(e, Partition)] == ["partition_timeout"]
    assert recovered(eff) == ["a0", "a1", "a2", "a3"]


def test_a_new_incarnation_during_a_partition_is_recovered_at_once() -> None:
    h = fleet(4)
    h.tick(2.0)
    assert h.partitioned
    eff = h.join("a1", "inc2", I, 2.5)
    assert recovered(eff) == ["a1"]


def test_small_losses_are_not_a_partition() -> None:
    h = fleet(3)  # one of three is 33% but below the minimum count
    h.beat("a1", "inc1", 1.5)
    h.beat("a2", "inc1", 1.5)
    eff = h.tick(1.6)
    assert recovered(eff) == ["a0"]
    assert not h.partitioned


def test_nothing_due_without_members() -> None:
    assert HealthTracker().next_check() == math.inf


def test_no_verdicts_while_the_observer_is_cut_off_nor_in_the_grace_after() -> None:
    """A restarted nats-server silences every agent for the orchestrator too: that silence
    must not kill anyone; after the grace, an agent still silent is judged as usual."""
    t = HealthTracker(3)
    for a in ("a", "b", "c"):
        t.join(a, "i1", 0.5, 0.0)
    t.observer_lost()
    assert t.tick(10.0) == [] and t.next_check() == math.inf
    t.observer_back(10.0, grace_s=5.0)
    assert t.tick(14.9) == []
    assert t.next_check() >= 15.0
    t.beat("b", "i1", 14.5)
    # a and c stayed silent through the whole grace: judged as soon as it is over
    out = t.tick(15.4)
    dead = {e.agent_id for e in out if isinstance(e, Transition) and e.new == "dead"}
    assert dead == {"a", "c"}
    assert not t.is_dead("b")
