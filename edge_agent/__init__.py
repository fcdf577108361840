"""The edge agent: describes its host, accepts placements, runs tasks, ships outputs."""
