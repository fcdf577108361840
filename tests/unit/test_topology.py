"""Tier presets carry the published figures; topology files validate and compose links the way
the launcher emulates them (a star through the hub)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from edge_agent.config import AgentConfig
from sim.linkemu import LinkProfile
from sim.tiers import LINK_PRESETS, TIER_PRESETS, TIERS, link_preset
from sim.topology import Topology, example_path, load_topology


def test_presets_carry_the_published_figures_and_a_source() -> None:
    assert link_preset("lan").latency_ms == 4.0  # EdgeCloudSim lan_internal_delay / iFogSim
    assert link_preset("lan-slow").latency_ms == 10.0
    assert (link_preset("wan").latency_ms, link_preset("wan").bandwidth_mbps) == (100.0, 20.0)
    assert (link_preset("wan-far").latency_ms, link_preset("wan-far").bandwidth_mbps) == (
        150.0,
        50.0,
    )
    assert link_preset("wlan").bandwidth_mbps == 300.0
    assert link_preset("wlan-congested").bandwidth_mbps == 10.0
    assert link_preset("man").bandwidth_mbps == 1000.0
    assert {
        link_preset("cellular").bandwidth_mbps,
        link_preset("cellular-slow").bandwidth_mbps,
    } == {
        10.0,
        20.0,
    }
    for p in LINK_PRESETS.values():
        assert p.source and p.loss == 0.0
        LinkProfile(p.latency_ms, p.jitter_ms, p.bandwidth_mbps, p.loss)  # valid profiles
    assert set(TIER_PRESETS) == set(TIERS)
    for t in TIER_PRESETS.values():
        assert t.uplink in LINK_PRESETS and t.lan in LINK_PRESETS and "iFogSim" in t.source
    with pytest.raises(KeyError, match="known: "):
        link_preset("carrier-pigeon")


def test_profiles_in_series_and_their_bounds() -> None:
    a = LinkProfile(latency_ms=4, jitter_ms=1, bandwidth_mbps=1000, loss=0.1)
    b = LinkProfile(latency_ms=100, jitter_ms=5, bandwidth_mbps=20, loss=0.1)
    s = a.then(b)
    assert (s.latency_ms, s.jitter_ms, s.bandwidth_mbps) == (104, 6, 20)
    assert s.loss == pytest.approx(0.19)
    assert LinkProfile().then(LinkProfile()).bandwidth_mbps is None
    for bad in ({"latency_ms": -1}, {"loss": 1.0}, {"bandwidth_mbps": 0}, {"jitter_ms": 1e999}):
        with pytest.raises(ValueError):
            LinkProfile(**bad)


def test_example_topologies_load_and_expand() -> None:
    small = load_topology(example_path("small.yaml"))
    assert small.hub_site == "cloud"
    assert [a for a, _ in small.expanded_agents()] == [
        "cloud",
        "edge-a-0",
        "edge-a-1",
        "edge-b-cam",
    ]
    campus = load_topology(example_path("campus.yaml"))
    assert len(campus.expanded_agents()) == 16
    assert campus.unemulated_links() == [("fog", "edge-1")]
    for topo in (small, campus):
        for _, agent in topo.expanded_agents():
            cfg = AgentConfig.model_validate(topo.agent_config(agent))
            assert cfg.devices and all(d.emulated for d in cfg.devices)
            assert not cfg.probe_cpu and not cfg.probe_gpus


def test_access_paths_and_declared_links_match_the_emulation() -> None:
    topo = load_topology(example_path("small.yaml"))
    # edge-a: site LAN (tier default lan, 4 ms) then the declared WAN uplink
    assert topo.access("edge-a") == LinkProfile(104.0, 5.2, 20.0, 0.0)
    # the hub has no uplink, only its LAN
    assert topo.access("cloud") == LinkProfile(4.0, 0.2, 1000.0, 0.0)
    links = {s.to_site: s for s in topo.declared_links("edge-b")}
    assert set(links) == {"cloud", "edge-a"}
    assert links["edge-a"].latency_ms == pytest.approx(
        topo.access("edge-b").latency_ms + topo.access("edge-a").latency_ms
    )
    assert links["cloud"].bandwidth_mbps == 20.0 and not links["cloud"].measured


def test_defaults_from_tier_presets() -> None:
    topo = Topology.model_validate(
        {
            "name": "t",
            "sites": [{"name": "c", "tier": "cloud"}, {"name": "d", "tier": "device"}],
            "agents": [{"id": "phone", "site": "d", "replicas": 3}],
        }
    )
    assert topo.hub_site == "c"
    assert topo.uplink("d") == _preset_profile("cellular")
    (dev,) = topo.devices(topo.agents[0])
    assert (dev.gflops, dev.slots, dev.emulated) == (TIER_PRESETS["device"].gflops, 1, True)
    assert [a for a, _ in topo.expanded_agents()] == ["phone-0", "phone-1", "phone-2"]


def _preset_profile(preset: str) -> LinkProfile:
    p = LINK_PRESETS[preset]
    return LinkProfile(p.latency_ms, p.jitter_ms, p.bandwidth_mbps, p.loss)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"links": [{"between": ["a", "zz"], "preset": "wan"}]}, "unknown site"),
        ({"links": [{"between": ["a", "a"], "preset": "wan"}]}, "itself"),
        ({"links": [{"between": ["a", "h"], "preset": "warp"}]}, "unknown link preset"),
        ({"links": [{"between": ["a", "h"]}]}, "preset or latency_ms"),
        (
            {
                "links": [
                    {"between": ["a", "h"], "preset": "wan"},
                    {"between": ["h", "a"], "preset": "man"},
                ]
            },
            "declared twice",
        ),
        ({"agents": [{"id": "x", "site": "nowhere"}]}, "unknown site"),
        (
            {"agents": [{"id": "x", "site": "a", "replicas": 2}, {"id": "x-1", "site": "h"}]},
            "duplicate agent",
        ),
        ({"hub": "nowhere"}, "hub"),
        (
            {"sites": [{"name": "h", "tier": "cloud"}, {"name": "h", "tier": "edge"}]},
            "duplicate site",
        ),
        ({"sites": [{"name": "h", "tier": "moon"}]}, "tier"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_invalid_topologies_say_why(patch: dict[str, object], message: str) -> None:
    base: dict[str, object] = {
        "name": "t",
        "sites": [{"name": "h", "tier": "cloud"}, {"name": "a", "tier": "edge", "lan": "wlan"}],
        "agents": [{"id": "x", "site": "a"}],
    }
    with pytest.raises(ValidationError, match=message):
        Topology.model_validate({**base, **patch})


def test_explicit_link_overrides_preset_fields(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(
        "name: t\nsites: [{name: h, tier: cloud, lan: none}, {name: a, tier: edge, lan: none}]\n"
        "links: [{between: [a, h], preset: wan, jitter_ms: 0, loss: 0.01}]\n"
        "agents: [{id: x, site: a, devices: [{kind: gpu, count: 2, gflops: 100}]}]\n"
    )
    topo = load_topology(f)
    assert topo.access("a") == LinkProfile(100.0, 0.0, 20.0, 0.01)
    assert [d.device_id for d in topo.devices(topo.agents[0])] == ["gpu0", "gpu1"]
