"""A pipeline's life as state: the run, its tasks, the events applied to it."""
