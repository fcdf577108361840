"""The one base class: strict, closed, so a typo or an extra field is an error, not a default."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        frozen=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
        ser_json_inf_nan="constants",
    )
