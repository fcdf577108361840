"""Placing a pipeline: the cluster view, planning, booking and offering, commits, and what
tasks read from the store."""
