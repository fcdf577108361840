"""Correction history in JetStream KV: one key per (task signature, device), written off the
hot path, read back on start so a restarted orchestrator keeps what it learned.

Not every change is written: a track is first written once it has MIN_SAVE_N observations,
then again when its observation count (its contended runs included: `seen`) has doubled, or
what it says (its warm history's centre once it has one, else its factor: `Track.level`) has
moved by MIN_SAVE_SHIFT (in log terms) since a write at least MIN_SHIFT_GAP_S old, and at stop
whatever changed. On noisy
work each observation moves the factor by more than MIN_SAVE_SHIFT (the EWMA takes 30% of
every accepted sample), so without the gap a busy track would be written at nearly every
flush, for a restart to remember a second's drift. On a fleet running ever new work (each
task's parameters a little different) writing every track would cost a KV write per finished
task for a single, noisy sample; this way a restart forgets at most a track's last small
drift, or a track seen once. The bucket's entries expire KEEP_S after their last write, and a
track still observed is written again within REFRESH_S: what nobody runs any more goes.

The shell that builds a History hands it the way to list the bucket's keys (`list_keys`, the
orchestrator's `infra.kvwatch.all_keys`): the predictor imports no orchestrator shell module.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js.errors import BucketNotFoundError

from orchestrator.predictor.correction import Corrections, Track
from schemas.codec import DecodeError, decode, encode
from schemas.predictor import CorrectionRecord, CorrectionTrack
from transport import connect

log = logging.getLogger("mars.predictor")
BUCKET = "MARS_PREDICTOR"
#: Longest a learned correction waits before it is written to KV.
FLUSH_EVERY_S = 1.0
#: Observations a track needs before it is written at all.
MIN_SAVE_N = 2
#: Track writes a flush keeps in flight at once.
SAVE_AT_ONCE = 32
#: Change of a track's level (log terms) since the last write that makes it due again (~5%).
MIN_SAVE_SHIFT = 0.05
#: A moved factor is written only once the track's last write is at least this old.
MIN_SHIFT_GAP_S = 60.0
#: The bucket's entries expire this long after their last write: a track nobody has observed
#: for a month goes (the bucket would otherwise hold every signature ever seen) ...
KEEP_S = 30 * 24 * 3600.0
#: ... and one still in use is written again at least this often, so it never expires.
REFRESH_S = KEEP_S / 3

#: A track's (observation count, `seen`; level; time of its last observation) when last written.
Saved = tuple[int, float, float]


def seen(track: Track) -> int:
    """A track's observations as its writes count them: those its factor took, and its
    contended runs (kept apart, they change the record too)."""
    return track.n + track.contended_n


#: Every key of a KV bucket, or None when it holds values but listing them kept failing.
KeyLister = Callable[[Any], Awaitable[list[str] | None]]


def due(track: Track, last: Saved | None, final: bool = False) -> bool:
    """Whether a changed track is worth a write now (see the module doc); `final`: at stop."""
    if track.n < MIN_SAVE_N:
        return False
    if last is None:
        return True
    n0, lf0, at0 = last
    if final:
        return (seen(track), track.level) != (n0, lf0)
    age = track.updated - at0
    return (
        seen(track) >= 2 * n0
        or (abs(track.level - lf0) >= MIN_SAVE_SHIFT and age >= MIN_SHIFT_GAP_S)
        or age >= REFRESH_S
    )


def kv_key(sig: str, device: str) -> str:
    """KV keys allow few characters; the device key is hashed and kept in the value."""
    return f"{sig}.{hashlib.blake2b(device.encode(), digest_size=8).hexdigest()}"


class History:
    def __init__(
        self, js: Any, corrections: Corrections, bucket: str = BUCKET, *, list_keys: KeyLister
    ) -> None:
        self.js = js
        self.corrections = corrections
        self.bucket = bucket
        self.list_keys = list_keys
        self.kv: Any = None
        self.writes = 0
        #: tracks changed since the last flush: a busy orchestrator sees the same (task,
        #: device) finish many times a second, and one write per flush window is enough
        self.dirty: set[tuple[str, str]] = set()
        self.changed = asyncio.Event()
        #: what each track was when last written (or loaded)
        self.saved: dict[tuple[str, str], Saved] = {}
        #: changed tracks with enough samples but not due yet: written at stop unless a
        #: later change makes them due first (a periodic flush looks only at `dirty`)
        self.held: set[tuple[str, str]] = set()

    def mark(self, sig: str, device: str) -> None:
        """Note a changed track; `flush` writes it (once, however often it changed)."""
        self.dirty.add((sig, device))
        self.changed.set()

    async def flush(self, final: bool = False) -> int:
        """Write every changed track that is due (`final`: every changed one with enough
        observations); returns how many were written."""
        todo = self.dirty | self.held if final else self.dirty
        self.dirty = set()
        self.changed.clear()
        ready: list[tuple[str, str]] = []
        for key in sorted(todo):
            track = self.corrections.get(*key)
            if track is None or track.n < MIN_SAVE_N:
                continue  # marked again when it changes
            if not due(track, self.saved.get(key), final):
                self.held.add(key)
                continue
            self.held.discard(key)
            ready.append(key)
        # SAVE_AT_ONCE writes in flight: thousands of tracks one round trip after another
        # held a stopping orchestrator for seconds
        for i in range(0, len(ready), SAVE_AT_ONCE):
            await asyncio.gather(*(self.save(*k) for k in ready[i : i + SAVE_AT_ONCE]))
        return len(ready)

    async def run(self, stopped: asyncio.Event, every_s: float = FLUSH_EVERY_S) -> None:
        """Flush at most every `every_s` while there is something to write, and once at stop."""
        while not stopped.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self.changed, stopped)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if not stopped.is_set():
                with contextlib.suppress(TimeoutError):  # gather a window's worth of changes
                    await asyncio.wait_for(stopped.wait(), every_s)
            await self.flush(final=stopped.is_set())

    async def start(self) -> int:
        """Open (or create) the bucket and load every track; returns how many."""
        try:
            self.kv = await self.js.key_value(self.bucket)
        except BucketNotFoundError:
            with contextlib.suppress(Exception):  # another replica may create it first
                await self.js.create_key_value(
                    bucket=self.bucket, history=1, ttl=KEEP_S, replicas=connect.js_replicas()
                )
            self.kv = await self.js.key_value(self.bucket)
        keys = await self._keys()
        read: list[tuple[str, str, Track]] = []
        for k in keys:
            try:
                entry = await self.kv.get(k)
                rec = decode(bytes(entry.value or b""), CorrectionRecord)
            except DecodeError as exc:  # written by something else: skipped, said once
                log.warning("correction %s unreadable (%s): %s", k, exc.code, exc.message)
                continue
            except Exception as exc:
                log.warning("loading correction %s failed: %s", k, exc)
                continue
            read.append((rec.sig, rec.device, Track(**rec.track.model_dump())))
        # more in the bucket than the bound: the least recently updated are not held
        held = self.corrections.load(read)
        for sig, device, track in held:
            self.saved[(sig, device)] = (seen(track), track.level, track.updated)
        return len(held)

    async def _keys(self) -> list[str]:
        keys = await self.list_keys(self.kv)
        if keys is None:
            log.warning("correction history: the bucket has values but listing its keys failed")
            return []
        return keys

    async def save(self, sig: str, device: str) -> None:
        """Write one track as it is now (last writer wins: a track is one orchestrator's view)."""
        track = self.corrections.get(sig, device)
        if self.kv is None or track is None:
            return
        body = encode(
            CorrectionRecord(sig=sig, device=device, track=CorrectionTrack(**track.to_dict()))
        )
        try:
            await self.kv.put(kv_key(sig, device), body)
            self.saved[(sig, device)] = (seen(track), track.level, track.updated)
            self.writes += 1
        except Exception as exc:
            log.warning("saving correction %s@%s failed: %s", sig, device, exc)
        if len(self.saved) > 2 * self.corrections.max_tracks:
            self._forget_dropped()

    def _forget_dropped(self) -> None:
        """What was written of tracks the corrections no longer hold (the least recently
        observed are dropped past their bound): kept, the bookkeeping would grow with every
        signature ever seen. Such a track starts afresh if its work comes back."""
        held = self.corrections.get
        self.saved = {k: v for k, v in self.saved.items() if held(*k) is not None}
        self.held = {k for k in self.held if held(*k) is not None}
