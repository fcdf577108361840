"""Artifacts on an agent: fetched from the object store on first use, verified, kept on disk.

A task names an artifact `name@sha256` (schemas/artifacts.py). The first task here that
needs one fetches it: its name's entry from the names bucket (unknown: the task fails
saying so; another kind than the task needs, or larger than the whole cache: likewise),
then its bytes, streamed to a file in `artifact_cache_dir` and hashed on the way. Bytes
whose sha256 is not the one named are deleted and refused, whatever the store says of
them. Later tasks reuse the file without asking the store anything (the digest pins the
bytes). Files beyond `artifact_cache_max_bytes` go, least recently used first, except
those a running task holds. Files left by an earlier run of the agent are hashed again
before their first use here: a file that no longer matches is deleted and fetched again.

Admission never waits for the network: an offer naming an artifact is accepted, the
fetch starts then (`prefetch`), and the run waits for it; what went wrong fails the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

from schemas import subjects
from schemas.agent import MAX_HELD_ARTIFACTS
from schemas.artifacts import ArtifactInfo, ArtifactKind, ArtifactRef, parse_ref
from schemas.codec import DecodeError, decode
from schemas.digests import sha256_file

log = logging.getLogger("mars.agent.artifacts")
_HEX = frozenset("0123456789abcdef")
#: Tries to hold an artifact that another fetch evicted as soon as it arrived.
HOLD_TRIES = 3


class ArtifactError(Exception):
    """An artifact a task needs cannot be had: said in words, as the task's error."""


def _is_digest(name: str) -> bool:
    return len(name) == 64 and set(name) <= _HEX


class _HashingFile:
    """Where the object store writes a fetched artifact: the file, hashed and counted as it
    is written; nothing is written past the size its name's entry declared (the bytes are
    counted on, and refused at the end: raising here would leave the store's subscription
    open)."""

    def __init__(self, path: Path, limit: int) -> None:
        self.fh = open(path, "xb")  # noqa: SIM115 (closed by the fetch, in every case)
        self.hash = hashlib.sha256()
        self.size = 0
        self.limit = limit

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size <= self.limit:
            self.hash.update(data)
            self.fh.write(data)
        return len(data)


@dataclass
class Cached:
    path: Path
    size: int
    #: Hashed by this process (a file an earlier run left is hashed again before use).
    verified: bool
    #: Running tasks holding it: never evicted while above 0.
    holds: int = 0


class ArtifactCache:
    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        *,
        fetch_timeout_s: float = 300.0,
        on_evict: Callable[[Path], None] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self.fetch_timeout_s = fetch_timeout_s
        #: Told of each file evicted (the ONNX executor drops its sessions of it).
        self.on_evict = on_evict
        self.on_change: Callable[[], None] | None = None
        #: fetched / reused / evicted / refused (bytes not matching their digest).
        self.stats: Counter[str] = Counter()
        self._files: OrderedDict[str, Cached] = OrderedDict()  # least recently used first
        self._flights: dict[str, asyncio.Future[None]] = {}
        self._reserved = 0  # bytes of fetches under way
        self._js: Any = None
        self.dir.mkdir(parents=True, exist_ok=True)
        self._scan()
        #: Told when what it holds changes from now on (the agent advertises it: `held`).
        self.on_change = on_change

    def attach(self, js: Any) -> None:
        self._js = js

    @property
    def used(self) -> int:
        return sum(c.size for c in self._files.values())

    def _scan(self) -> None:
        """Files an earlier run left, oldest use first; half-written ones deleted."""
        found: list[tuple[float, str, Path, int]] = []
        for p in self.dir.iterdir():
            if not p.is_file():
                continue
            if not _is_digest(p.name):
                p.unlink(missing_ok=True)  # a fetch cut short
                continue
            st = p.stat()
            found.append((st.st_mtime, p.name, p, st.st_size))
        for _, sha, p, size in sorted(found):
            self._files[sha] = Cached(p, size, verified=False)
        with contextlib.suppress(ArtifactError):
            self._make_room(0)

    def held(self) -> list[str]:
        """The digests it holds (the most recently used, an advert's worth), sorted: using
        one changes nothing placement reads."""
        return sorted(list(reversed(self._files))[:MAX_HELD_ARTIFACTS])

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def cached(self, sha256: str) -> Path | None:
        """The verified file of an artifact, if this agent holds one (no I/O)."""
        c = self._files.get(sha256)
        return c.path if c is not None and c.verified else None

    @contextlib.asynccontextmanager
    async def holding(self, model: str, kind: ArtifactKind) -> AsyncIterator[Path | None]:
        """While a task runs: the file of the artifact `model` names, fetched if need be and
        never evicted meanwhile; None when `model` names no artifact."""
        ref = parse_ref(model)
        if ref is None:
            yield None
            return
        held = await self.hold(ref, kind)
        try:
            yield held.path
        finally:
            held.holds -= 1

    async def hold(self, ref: ArtifactRef, kind: ArtifactKind) -> Cached:
        """The artifact's file, held (`holds` counted up: the caller counts it down)."""
        for _ in range(HOLD_TRIES):
            c = self._files.get(ref.sha256)
            if c is not None and not c.verified:
                await self._verify(ref.sha256, c)
                c = self._files.get(ref.sha256)
            if c is not None:
                self._files.move_to_end(ref.sha256)
                with contextlib.suppress(OSError):
                    os.utime(c.path)  # its last use, for the order after a restart
                self.stats["reused"] += 1
                c.holds += 1
                return c
            flight = self._flights.get(ref.sha256)
            if flight is None:
                flight = self._flights[ref.sha256] = asyncio.ensure_future(self._fetch(ref, kind))
                flight.add_done_callback(functools.partial(self._landed, ref.sha256))
            await asyncio.shield(flight)
            c = self._files.get(ref.sha256)
            if c is not None:
                self._files.move_to_end(ref.sha256)
                c.holds += 1
                return c
        raise ArtifactError(
            f"artifact {ref}: evicted as soon as it was fetched, {HOLD_TRIES} times "
            f"(artifact_cache_max_bytes {self.max_bytes} B is too small for the tasks here)"
        )

    async def close(self) -> None:
        """End the fetches under way (the agent stops)."""
        flights = list(self._flights.values())
        for f in flights:
            f.cancel()
        for f in flights:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await f

    def _landed(self, sha: str, flight: asyncio.Future[None]) -> None:
        self._flights.pop(sha, None)
        if not flight.cancelled():
            flight.exception()  # retrieved: each caller that waited was given it already

    async def prefetch(self, model: str, kind: ArtifactKind) -> None:
        """Fetch the artifact `model` names ahead of its run (an offer was accepted); what
        goes wrong is said again by the run, as its task's error."""
        try:
            async with self.holding(model, kind):
                pass
        except Exception as exc:
            log.debug("prefetch of %s: %s", model, exc)

    async def _verify(self, sha: str, c: Cached) -> None:
        try:
            got = await asyncio.to_thread(sha256_file, c.path)
        except OSError:
            got = ""
        if self._files.get(sha) is not c:
            return
        if got == sha:
            c.verified = True
            return
        log.warning("cached artifact %s no longer matches its digest: deleted", sha)
        self.stats["refused"] += 1
        self._drop(sha)

    def _drop(self, sha: str) -> None:
        c = self._files.pop(sha)
        c.path.unlink(missing_ok=True)
        if self.on_evict is not None:
            self.on_evict(c.path)
        self._changed()

    def _make_room(self, size: int) -> None:
        """Evict the least recently used files not held until `size` more bytes fit."""
        over = self.used + self._reserved + size - self.max_bytes
        for sha in list(self._files):
            if over <= 0:
                break
            c = self._files[sha]
            if c.holds:
                continue
            over -= c.size
            self._drop(sha)
            self.stats["evicted"] += 1
            log.info("artifact %s evicted (%d B) to make room", sha, c.size)
        if over > 0:
            raise ArtifactError(
                f"artifact cache full: {size} B more do not fit in artifact_cache_max_bytes "
                f"{self.max_bytes} B beside the artifacts running tasks hold"
            )

    async def _info(self, ref: ArtifactRef) -> ArtifactInfo:
        try:
            kv = await self._js.key_value(subjects.ARTIFACT_NAMES_BUCKET)
            entry = await kv.get(subjects.artifact_key(ref.name, ref.sha256))
        except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
            raise ArtifactError(
                f"artifact {ref} is not in the artifact store (`mars artifact ls` lists what "
                "is; `mars artifact put FILE` adds one)"
            ) from None
        try:
            return decode(entry.value or b"", ArtifactInfo)
        except DecodeError as exc:
            raise ArtifactError(f"artifact {ref}: its entry does not read: {exc}") from None

    async def _fetch(self, ref: ArtifactRef, kind: ArtifactKind) -> None:
        if self._js is None:
            raise ArtifactError(f"artifact {ref}: not held here, and not connected to fetch it")
        info = await self._info(ref)
        if info.kind != kind:
            raise ArtifactError(f"artifact {ref} is a {info.kind}, not {kind}")
        if info.size > self.max_bytes:
            raise ArtifactError(
                f"artifact {ref} is {info.size} B, more than this agent's whole artifact "
                f"cache (artifact_cache_max_bytes {self.max_bytes} B)"
            )
        self._make_room(info.size)
        self._reserved += info.size
        part = self.dir / f".{ref.sha256}.{uuid.uuid4().hex[:8]}.part"
        t0 = time.monotonic()
        try:
            out = _HashingFile(part, info.size)
            try:
                async with asyncio.timeout(self.fetch_timeout_s):
                    store = await self._js.object_store(subjects.ARTIFACTS_BUCKET)
                    await store.get(ref.sha256, writeinto=out)
            except TimeoutError:
                raise ArtifactError(
                    f"artifact {ref}: not fetched within {self.fetch_timeout_s:g} s"
                ) from None
            except (BucketNotFoundError, NotFoundError):
                raise ArtifactError(
                    f"artifact {ref} is named in the artifact store but its bytes are gone "
                    "(removed meanwhile? put it again)"
                ) from None
            except Exception as exc:  # the store's own digest check, a lost connection
                raise ArtifactError(f"artifact {ref}: fetch failed: {exc!r}") from None
            finally:
                out.fh.close()
            got = out.hash.hexdigest()
            if got != ref.sha256 or out.size != info.size:
                self.stats["refused"] += 1
                raise ArtifactError(
                    f"artifact {ref}: sha256 mismatch: the store's bytes ({out.size} B) hash "
                    f"to {got}; refused and deleted"
                )
            final = self.dir / ref.sha256
            os.chmod(part, 0o444)
            os.replace(part, final)
            self._files[ref.sha256] = Cached(final, info.size, verified=True)
            self.stats["fetched"] += 1
            self._changed()
            log.info("artifact %s fetched: %d B in %.3f s", ref, info.size, time.monotonic() - t0)
        finally:
            self._reserved -= info.size
            part.unlink(missing_ok=True)
