"""A pipeline input stored long ago is stored again when named anew: its copy is kept for the
bucket's age limit from when it was stored, and a pipeline submitted late in that time would
otherwise lose its input midway."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest

from console import inputs
from schemas import subjects

pytestmark = pytest.mark.integration

KEEP_S = 3600.0


async def test_an_input_past_half_its_age_limit_is_stored_again(
    nats_url: str, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        bucket = await inputs.bucket(js, keep_s=KEEP_S)
        f = tmp_path / "frames.txt"
        f.write_bytes(b"north gate, 06:00\n" * 1000)
        given = inputs.describe("frames", f)
        assert await inputs.put(js, given, f)  # first time: sent
        first = await bucket.get_info(given.sha256)
        assert not await inputs.put(js, given, f)  # fresh: not sent again
        soon = datetime.now(UTC) + timedelta(seconds=KEEP_S / 2 - 60)
        assert not await inputs.put(js, given, f, now=soon)
        late = datetime.now(UTC) + timedelta(seconds=KEEP_S / 2 + 60)
        assert await inputs.put(js, given, f, now=late)  # past half its life: stored again
        again = await bucket.get_info(given.sha256)
        assert datetime.fromisoformat(again.mtime) > datetime.fromisoformat(first.mtime)
        assert again.nuid != first.nuid  # new chunks, a new age
        assert (await bucket.get(given.sha256)).data == f.read_bytes()
        state = (await js.stream_info(f"OBJ_{subjects.INPUTS_BUCKET}")).state
        assert state.messages == 2  # one chunk and one entry: the old copy is gone
    finally:
        await nc.close()
