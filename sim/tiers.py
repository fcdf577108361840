"""Network-tier presets: device / edge / fog / cloud and the links between them.

Why: an emulated fleet is only as believable as its link figures, so we take them from the
two simulators the edge-computing literature uses most instead of inventing them:

- **EdgeCloudSim** (Sonmez, Ozgovde, Ersoy, "EdgeCloudSim: An environment for performance
  evaluation of edge computing systems", Trans. Emerging Telecommunications Technologies
  29(11), 2018; github.com/CagataySonmez/EdgeCloudSim):
  - `config/default_config.properties`: `wan_propogation_delay=0.1` (100 ms),
    `lan_internal_delay=0.004` (4 ms), `wlan_bandwidth=300`, `wan_bandwidth=20`,
    `gsm_bandwidth=10` (Mbps);
  - `scripts/sample_app5/config/default_config.properties` (the vehicular scenario):
    `wan_propogation_delay=0.15`, `gsm_propogation_delay=0.16`, `lan_internal_delay=0.01`,
    `wlan_bandwidth=10`, `man_bandwidth=1000`, `wan_bandwidth=50`, `gsm_bandwidth=20`.
- **iFogSim** (Gupta, Vahid Dastjerdi, Ghosh, Buyya, "iFogSim: A toolkit for modeling and
  simulation of resource management techniques in the Internet of Things, Edge and Fog
  computing environments", Software: Practice and Experience 47(9), 2017;
  github.com/Cloudslab/iFogSim, `VRGameFog.java`): proxy-server -> cloud uplink 100 ms,
  gateway -> proxy 4 ms, mobile -> gateway 2 ms; compute 1,000 MIPS (mobile), 2,800 MIPS
  (gateway and proxy) and 44,800 MIPS (cloud).

Neither simulator models jitter or loss; every preset here has loss 0, and the jitter figures
are our own assumption (marked as such in `source`), a few percent of the latency.
`latency_ms` is one-way. Pure data: no I/O, safe to import from the simulator core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TierName = Literal["device", "edge", "fog", "cloud"]
TIERS: tuple[TierName, ...] = ("device", "edge", "fog", "cloud")

_ECS_DEFAULT = "EdgeCloudSim config/default_config.properties"
_ECS_APP5 = "EdgeCloudSim scripts/sample_app5/config/default_config.properties"
_IFOG = "iFogSim VRGameFog.java"
_JITTER = "jitter: MARS assumption (the simulators model none)"


@dataclass(frozen=True, slots=True)
class LinkPreset:
    """One link class with its figures and where they come from."""

    name: str
    latency_ms: float
    jitter_ms: float
    bandwidth_mbps: float | None
    loss: float
    source: str


LINK_PRESETS: dict[str, LinkPreset] = {
    p.name: p
    for p in (
        # No emulation at all (same host, or a link we do not want to model).
        LinkPreset("none", 0.0, 0.0, None, 0.0, "no emulation"),
        # LAN inside a site: EdgeCloudSim lan_internal_delay=0.004; iFogSim gateway->proxy 4 ms.
        # Bandwidth: MAN figure of EdgeCloudSim sample_app5 (1000 Mbps), i.e. gigabit Ethernet.
        LinkPreset(
            "lan", 4.0, 0.2, 1000.0, 0.0, f"{_ECS_DEFAULT}; {_IFOG}; {_ECS_APP5} (bw); {_JITTER}"
        ),
        # The slow end of the LAN range: sample_app5 lan_internal_delay=0.01.
        LinkPreset("lan-slow", 10.0, 0.5, 1000.0, 0.0, f"{_ECS_APP5}; {_JITTER}"),
        # Wi-Fi to the access point: iFogSim mobile->gateway 2 ms; wlan_bandwidth=300.
        LinkPreset("wlan", 2.0, 0.5, 300.0, 0.0, f"{_IFOG} (latency); {_ECS_DEFAULT}; {_JITTER}"),
        # A crowded WLAN: sample_app5 wlan_bandwidth=10.
        LinkPreset(
            "wlan-congested", 2.0, 1.0, 10.0, 0.0, f"{_IFOG} (latency); {_ECS_APP5}; {_JITTER}"
        ),
        # Metro network between edge/fog sites: man_bandwidth=1000, lan_internal_delay=0.01.
        LinkPreset("man", 10.0, 0.5, 1000.0, 0.0, f"{_ECS_APP5}; {_JITTER}"),
        # Internet to the cloud: wan_propogation_delay=0.1, wan_bandwidth=20; iFogSim 100 ms.
        LinkPreset("wan", 100.0, 5.0, 20.0, 0.0, f"{_ECS_DEFAULT}; {_IFOG}; {_JITTER}"),
        # The far/faster WAN of sample_app5: 150 ms, 50 Mbps.
        LinkPreset("wan-far", 150.0, 7.5, 50.0, 0.0, f"{_ECS_APP5}; {_JITTER}"),
        # Cellular (GSM in EdgeCloudSim): gsm_propogation_delay=0.16, gsm_bandwidth=20.
        LinkPreset("cellular", 160.0, 10.0, 20.0, 0.0, f"{_ECS_APP5}; {_JITTER}"),
        # Cellular at the default config's gsm_bandwidth=10.
        LinkPreset(
            "cellular-slow",
            160.0,
            10.0,
            10.0,
            0.0,
            f"{_ECS_APP5} (latency); {_ECS_DEFAULT} (bw); {_JITTER}",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class TierPreset:
    """What a site of a tier looks like when the topology does not say."""

    name: TierName
    #: Link from a site of this tier to the hub (the cloud) when no link is declared.
    uplink: str
    #: Link from an agent to its own site's network.
    lan: str
    #: Compute of a typical node in iFogSim's VRGame topology (MIPS).
    mips: float
    #: Declared GFLOP/s of a default emulated cpu: MIPS / 200 (our scaling, so a cloud node
    #: is 44.8x a device as in iFogSim; the absolute figure is an assumption).
    gflops: float
    slots: int
    source: str


TIER_PRESETS: dict[TierName, TierPreset] = {
    "device": TierPreset("device", "cellular", "none", 1000.0, 5.0, 1, f"{_IFOG} (mobile)"),
    "edge": TierPreset("edge", "wan", "lan", 2800.0, 14.0, 2, f"{_IFOG} (gateway)"),
    "fog": TierPreset("fog", "wan", "lan", 2800.0, 14.0, 4, f"{_IFOG} (proxy-server)"),
    "cloud": TierPreset("cloud", "none", "lan", 44800.0, 224.0, 8, f"{_IFOG} (cloud)"),
}


def link_preset(name: str) -> LinkPreset:
    """The preset called `name`; the error lists the known ones."""
    try:
        return LINK_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(LINK_PRESETS))
        raise KeyError(f"unknown link preset {name!r} (known: {known})") from None
