"""Simulation side of MARS: network tiers, workloads and (later) a discrete-event simulator.

Pure like the scheduling core: no asyncio, no NATS; every random choice comes from a seed.
"""
