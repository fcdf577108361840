"""Build and measurement tools run from the repository root (`python -m tools.NAME`)."""
