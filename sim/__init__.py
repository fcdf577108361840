"""Simulation side of MARS: workloads, network tiers, emulated fleets and (later) a
discrete-event simulator.

`sim.workloads` is pure like the scheduling core (no asyncio, no NATS; every random choice
comes from a seed). `sim.fleet` is the exception: it runs many real agents with *emulated*
devices against a real NATS server, for load tests.
"""
