"""sha256 of files, as everything content-addressed in MARS names them (artifacts, pipeline
inputs, outputs): read in chunks, never whole into memory."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
