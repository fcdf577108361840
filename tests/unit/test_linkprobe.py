"""Link probing, pure parts: smoothing, target choice, per-site aggregation, what to advertise,
and the orchestrator's site-to-site model built from many agents' reports."""

from __future__ import annotations

import random

import pytest

from edge_agent.config import AgentConfig
from edge_agent.linkprobe import (
    MAX_MBPS,
    LinkProber,
    Peer,
    PeerEstimate,
    ProbeSample,
    bandwidth_mbps,
    choose_targets,
    ewma,
    merge_links,
    rtt_and_jitter,
    significant,
    site_links,
    update_estimate,
)
from orchestrator.placement.registry import aggregate_links
from schemas.agent import AgentAdvert, DeviceSpec, LinkSpec


def peer(aid: str, site: str) -> Peer:
    return Peer(aid, site, "edge", last_seen=0.0, ttl_s=10.0)


def test_ewma_starts_at_the_first_sample_then_blends() -> None:
    assert ewma(None, 10.0) == 10.0
    assert ewma(10.0, 20.0, alpha=0.25) == pytest.approx(12.5)


def test_rtt_is_the_median_and_jitter_the_mean_successive_difference() -> None:
    rtt, jitter = rtt_and_jitter([1.0, 3.0, 2.0])
    assert rtt == 2.0 and jitter == pytest.approx(1.5)
    assert rtt_and_jitter([4.0]) == (4.0, 0.0)
    with pytest.raises(ValueError):
        rtt_and_jitter([])


def test_bandwidth_is_the_bulk_time_minus_the_rtt() -> None:
    # 256 KiB took 3.1 ms of which 1 ms is the round trip: 2.1 ms to move 2 Mbit
    assert bandwidth_mbps(262_144, 0.0031, 0.001) == pytest.approx(262_144 * 8 / 0.0021 / 1e6)
    # a bulk reply faster than the small RTT means "very fast", never negative or infinite
    fast = bandwidth_mbps(262_144, 0.0005, 0.001)
    assert 0 < fast <= MAX_MBPS


def test_estimates_are_smoothed_and_keep_bandwidth_when_a_bulk_probe_is_skipped() -> None:
    first = update_estimate(None, ProbeSample((2.0, 2.0, 2.0), 0.003, 250_000))
    assert first.rtt_ms == 2.0 and first.jitter_ms == 0.0
    assert first.bandwidth_mbps == pytest.approx(250_000 * 8 / 0.001 / 1e6)
    second = update_estimate(first, ProbeSample((4.0, 6.0, 4.0)), alpha=0.5)
    assert second.rtt_ms == pytest.approx(3.0)  # (2 + 4) / 2
    assert second.jitter_ms == pytest.approx(1.0)  # (0 + 2) / 2
    assert second.bandwidth_mbps == first.bandwidth_mbps and second.samples == 2


def test_targets_rotate_over_sites_within_the_budget() -> None:
    peers = [peer("a1", "home"), peer("a2", "home"), peer("b1", "b"), peer("c1", "c")]
    peers += [peer(f"cl{i}", "cloud") for i in range(5)]
    rng = random.Random(1)
    last: dict[str, int] = {}
    seen: list[str] = []
    for rnd in range(1, 5):
        chosen = choose_targets(peers, last, max_peers=2, per_site=1, rng=rng, own_site="home")
        assert len(chosen) == 2 and len({p.site for p in chosen}) == 2
        for p in chosen:
            last[p.site] = rnd
        seen += [p.site for p in chosen]
    assert seen[0] == "home"  # never-probed sites first, this agent's own site winning ties
    assert set(seen[:4]) == {"home", "b", "c", "cloud"}  # every site, the cloud included
    many = choose_targets(peers, {}, max_peers=10, per_site=2, rng=rng, own_site="home")
    by_site = [p.site for p in many]
    assert by_site.count("cloud") == 2 and by_site.count("home") == 2 and len(many) == 6


def test_site_links_take_the_median_over_peers_with_a_bandwidth_figure() -> None:
    peers = {p.agent_id: p for p in [peer("b1", "b"), peer("b2", "b"), peer("b3", "b")]}
    peers["c1"] = peer("c1", "c")
    est = {
        "b1": PeerEstimate(rtt_ms=2.0, jitter_ms=0.1, bandwidth_mbps=100.0),
        "b2": PeerEstimate(rtt_ms=4.0, jitter_ms=0.3, bandwidth_mbps=300.0),
        "b3": PeerEstimate(rtt_ms=90.0, jitter_ms=0.2, bandwidth_mbps=200.0),
        "c1": PeerEstimate(rtt_ms=1.0, jitter_ms=0.0, bandwidth_mbps=None),
        "gone": PeerEstimate(rtt_ms=1.0, jitter_ms=0.0, bandwidth_mbps=1.0),
    }
    links = site_links(peers, est, {"b": 0.09})
    assert list(links) == ["b"]  # c has no bandwidth figure yet; "gone" is no known peer
    assert links["b"] == LinkSpec(
        to_site="b",
        latency_ms=2.0,  # median RTT 4 ms, one way
        bandwidth_mbps=200.0,
        cost_per_gb=0.09,
        measured=True,
        jitter_ms=0.2,
    )


def test_only_real_changes_are_re_advertised() -> None:
    old = LinkSpec(to_site="b", latency_ms=20.0, bandwidth_mbps=100.0, measured=True)
    assert significant(None, old)
    assert not significant(old, old.model_copy(update={"latency_ms": 21.5}))
    assert significant(old, old.model_copy(update={"latency_ms": 23.0}))
    loop = old.model_copy(update={"latency_ms": 0.1})
    assert not significant(loop, loop.model_copy(update={"latency_ms": 0.4}))  # 0.5 ms floor
    assert not significant(old, old.model_copy(update={"bandwidth_mbps": 115.0}))
    assert significant(old, old.model_copy(update={"bandwidth_mbps": 75.0}))


def test_measured_links_replace_declared_ones_for_the_same_site_only() -> None:
    declared = [
        LinkSpec(to_site="cloud", latency_ms=100.0, bandwidth_mbps=25.0, cost_per_gb=0.09),
        LinkSpec(to_site="b", latency_ms=50.0, bandwidth_mbps=10.0),
    ]
    measured = {"b": LinkSpec(to_site="b", latency_ms=1.0, bandwidth_mbps=900.0, measured=True)}
    assert merge_links(declared, measured) == [measured["b"], declared[0]]
    assert merge_links(declared, {}) == declared


def advert(aid: str, site: str, links: list[LinkSpec] | None = None) -> AgentAdvert:
    return AgentAdvert(
        agent_id=aid,
        incarnation="i1",
        site=site,
        tier="edge",
        devices=[DeviceSpec(device_id="cpu0", kind="cpu")],
        links=links or [],
        heartbeat_interval_s=0.1,
    )


def test_prober_forgets_silent_peers_and_falls_back_to_declared_links() -> None:
    cfg = AgentConfig(
        site="a",
        link_probe_every_s=1.0,
        links=[LinkSpec(to_site="b", latency_ms=50.0, bandwidth_mbps=10.0, cost_per_gb=0.02)],
    )
    prober = LinkProber("a1", cfg, advert_every=10)
    prober.on_advert(advert("a1", "a"), now=0.0)  # its own advert: not a peer
    prober.on_advert(advert("b1", "b"), now=0.0)
    assert list(prober.peers) == ["b1"] and prober.peers["b1"].ttl_s == pytest.approx(4.0)
    prober.estimates["b1"] = PeerEstimate(rtt_ms=1.0, jitter_ms=0.0, bandwidth_mbps=800.0)
    assert prober.refresh()
    (link,) = prober.links(cfg.links)
    assert link.measured and link.latency_ms == 0.5 and link.cost_per_gb == 0.02
    assert not prober.refresh()  # nothing changed: no new advert needed
    prober.prune(now=3.0)
    assert "b1" in prober.peers
    prober.prune(now=5.0)  # three advert periods (3 x 10 x 0.1 s) and a second of grace
    assert prober.peers == {} and prober.estimates == {}
    assert prober.refresh()
    assert prober.links(cfg.links) == cfg.links


def test_site_model_takes_medians_and_measured_beats_declared() -> None:
    def link(to: str, ms: float, mbps: float, measured: bool, cost: float = 0.0) -> LinkSpec:
        return LinkSpec(
            to_site=to, latency_ms=ms, bandwidth_mbps=mbps, measured=measured, cost_per_gb=cost
        )

    adverts = [
        advert("a1", "a", [link("b", 2.0, 800.0, True), link("c", 100.0, 25.0, False, 0.09)]),
        advert("a2", "a", [link("b", 4.0, 400.0, True), link("c", 80.0, 50.0, False, 0.09)]),
        advert("a3", "a", [link("b", 90.0, 200.0, True)]),
        advert("a4", "a", [link("b", 100.0, 1.0, False)]),  # declared: outvoted by measurements
        advert("b1", "b", [link("a", 3.0, 500.0, True)]),
    ]
    model = aggregate_links(adverts)
    assert set(model) == {("a", "b"), ("a", "c"), ("b", "a")}
    ab = model[("a", "b")]
    assert ab.latency_s == pytest.approx(0.004) and ab.bandwidth_Bps == pytest.approx(400e6 / 8)
    ac = model[("a", "c")]  # only declared reports: their median (of two: the mean)
    assert ac.latency_s == pytest.approx(0.090) and ac.cost_per_gb == pytest.approx(0.09)
    assert model[("b", "a")].latency_s == pytest.approx(0.003)
