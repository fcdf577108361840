"""Where generated files go on a machine, and how they are written (secrets 0600)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PREFIX = "/etc/mars"
DEFAULT_STATE = "/var/lib/mars"


def write(path: Path, data: str | bytes, *, secret: bool = False) -> None:
    """Whole or not at all (a temp file renamed), private when `secret`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(tmp, flags, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
