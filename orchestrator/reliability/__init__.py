"""Keeping pipelines alive: agent health, recovery, the watchdog, ownership and fail-over
between replicas, adaptive moves, displaced tasks, the results ledger."""
