"""Pipelines written by people: YAML or JSON files, read through the one codec."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from schemas.codec import DecodeError, decode
from schemas.limits import MAX_PAYLOAD_BYTES
from schemas.pipeline import PipelineSpec


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read a pipeline file; raises DecodeError (with a code) on anything wrong."""
    p = Path(path)
    raw = p.read_bytes()
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise DecodeError("payload_too_large", f"{p}: file exceeds {MAX_PAYLOAD_BYTES} bytes")
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            obj = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise DecodeError("bad_request", f"{p}: not valid YAML: {exc}") from exc
        raw = json.dumps(obj).encode()
    return decode(raw, PipelineSpec, "json")
