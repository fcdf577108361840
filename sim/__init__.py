"""Simulation side of MARS: workloads, network tiers, emulated fleets and a
discrete-event simulator (`sim.des`; scenarios in `sim.scenarios`, run by `sim.run`).

`sim.workloads` is pure like the scheduling core (no asyncio, no NATS; every random choice
comes from a seed). `sim.fleet` is the exception: it runs many real agents with *emulated*
devices against a real NATS server, for load tests.
`sim.tiers` (link and tier presets with their sources) and `sim.topology` (topology files)
are pure data; `sim.linkemu` (a shaping TCP proxy) and `sim.launcher` (`mars sim up/down`)
put real agent processes behind emulated links (docs/sim.md).
"""
