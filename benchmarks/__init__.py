"""Benchmark commands: they print figures (and ratios against references run in the same
process); tests never assert speed."""
