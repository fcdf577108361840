"""Outputs a producer's agent keeps until every consumer confirmed receipt. Pure, synchronous.

A consumer that is re-placed after its producer finished fetches the output again from here, so
a retained output is let go only when all its consumers acknowledged it, when its pipeline is
cancelled, or when it is older than `max_age_s`. One that every consumer acknowledged is still
kept a while (`DELIVERED_KEEP_S`, at most `DELIVERED_KEPT`, the first to go for room): a
consumer's job that took it may be withdrawn just after (a re-plan moved it), and its next
placement fetches it from here instead of having the producer run again. Memory is bounded
(`memory_bytes`; larger or later outputs spill to files) and so is the total (`max_bytes`; the
oldest go first). Spilled outputs carry a small JSON sidecar and are found again after a
restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from schemas.pipeline import MediaType

log = logging.getLogger("mars.agent.retention")
#: How long an output every consumer acknowledged is still kept, and how many such at most.
DELIVERED_KEEP_S = 30.0
DELIVERED_KEPT = 256
Key = tuple[str, str]  # (pipeline_id, producer task)


@dataclass
class Retained:
    pipeline_id: str
    producer: str
    token: int
    sha256: str
    size: int
    #: consumer task -> the agent it runs on (latest route wins)
    consumers: dict[str, str]
    acked: set[str] = field(default_factory=set)
    created: float = 0.0
    data: bytes | None = None
    path: Path | None = None
    #: Key in the data object store once put there.
    object_key: str | None = None
    #: What its executor made it as (None: known by its bytes), sent with it to consumers.
    media_type: MediaType | None = None

    @property
    def key(self) -> Key:
        return (self.pipeline_id, self.producer)

    def unacked(self) -> dict[str, str]:
        return {c: a for c, a in self.consumers.items() if c not in self.acked}

    def meta(self) -> dict[str, Any]:
        return {
            "pipeline_id": self.pipeline_id,
            "producer": self.producer,
            "token": self.token,
            "sha256": self.sha256,
            "size": self.size,
            "consumers": self.consumers,
            "acked": sorted(self.acked),
            "created": self.created,
            "object_key": self.object_key,
            "media_type": self.media_type,
        }


class OutputStore:
    def __init__(
        self,
        spill_dir: str | Path,
        *,
        memory_bytes: int = 32 << 20,
        max_bytes: int = 1 << 30,
        max_age_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dir = Path(spill_dir)
        self.memory_bytes = memory_bytes
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.clock = clock  # wall clock: ages survive a restart
        self.entries: dict[Key, Retained] = {}
        #: Outputs every consumer acknowledged, kept a while, oldest first (by delivery).
        self.delivered: OrderedDict[Key, tuple[float, Retained]] = OrderedDict()
        self.bytes = 0
        self.memory = 0
        self.dir.mkdir(parents=True, exist_ok=True)
        self._reload()

    # -- queries --------------------------------------------------------------------------------
    def get(self, pipeline_id: str, producer: str) -> Retained | None:
        """The output kept, waiting for consumers or delivered to them all a while ago."""
        key = (pipeline_id, producer)
        entry = self.entries.get(key)
        if entry is None and key in self.delivered:
            entry = self.delivered[key][1]
        return entry

    def read(self, entry: Retained) -> bytes:
        if entry.data is not None:
            return entry.data
        assert entry.path is not None
        return entry.path.read_bytes()

    def __len__(self) -> int:
        return len(self.entries)

    # -- changes --------------------------------------------------------------------------------
    def put(
        self,
        pipeline_id: str,
        producer: str,
        token: int,
        data: bytes,
        consumers: dict[str, str],
        *,
        spill: bool = False,
        hold: bool = False,
        media_type: MediaType | None = None,
        sha256: str | None = None,
    ) -> tuple[Retained | None, list[Retained]]:
        """Keep an output; returns it (None if not kept) and whatever was pushed out for room.

        `spill` writes it to disk at once (the agent is offline: it must survive a crash);
        `hold` keeps it in memory even past `memory_bytes` until `fit_memory` (it is being
        sent, from these bytes: written to disk first, it was read back for that). `sha256`:
        the digest of `data` when the caller has it (else computed here).
        """
        dropped: list[Retained] = []
        old = self.get(pipeline_id, producer)
        if old is not None:
            self._remove(old)
            dropped.append(old)
        size = len(data)
        if not consumers or size > self.max_bytes:
            if consumers:
                log.warning("output %s/%s of %d B exceeds retention", pipeline_id, producer, size)
            return None, dropped
        # delivered outputs go first for room, in memory and in all
        while self.delivered and (
            self.bytes + size > self.max_bytes or self.memory + size > self.memory_bytes
        ):
            self._remove(next(iter(self.delivered.values()))[1])
        for victim in sorted(self.entries.values(), key=lambda e: e.created):
            if self.bytes + size <= self.max_bytes:
                break
            log.warning("retention full: dropping %s/%s", victim.pipeline_id, victim.producer)
            self._remove(victim)
            dropped.append(victim)
        entry = Retained(
            pipeline_id,
            producer,
            token,
            sha256 or hashlib.sha256(data).hexdigest(),
            size,
            dict(consumers),
            created=self.clock(),
            media_type=media_type,
        )
        if spill or (not hold and self.memory + size > self.memory_bytes):
            self._spill(entry, data)
        else:
            entry.data = data
            self.memory += size
        self.entries[entry.key] = entry
        self.bytes += size
        return entry, dropped

    def route(self, pipeline_id: str, producer: str, consumer: str, agent_id: str) -> None:
        """A consumer runs (now) on `agent_id` and does not hold the output (it asked for it):
        kept until it acknowledges it there, delivered to all before or not."""
        key = (pipeline_id, producer)
        entry = self.entries.get(key)
        if entry is None and key in self.delivered:
            entry = self.delivered.pop(key)[1]
            self.entries[key] = entry
        if entry is not None and (
            entry.consumers.get(consumer) != agent_id or consumer in entry.acked
        ):
            entry.consumers[consumer] = agent_id
            entry.acked.discard(consumer)
            self._save_meta(entry)

    def ack(
        self, pipeline_id: str, producer: str, consumer: str, token: int | None = None
    ) -> Retained | None:
        """Note a receipt; returns the entry if that was the last one: it is no longer
        waited on (its object copy may go), and is kept as delivered a while."""
        entry = self.entries.get((pipeline_id, producer))
        if entry is None or (token is not None and token != entry.token):
            return None
        entry.acked.add(consumer)
        if entry.unacked():
            self._save_meta(entry)
            return None
        del self.entries[entry.key]
        self.delivered[entry.key] = (self.clock(), entry)
        self._save_meta(entry)
        while len(self.delivered) > DELIVERED_KEPT:
            self._remove(next(iter(self.delivered.values()))[1])
        return entry

    def drop_pipeline(
        self, pipeline_id: str, producers: Iterable[str] | None = None
    ) -> list[Retained]:
        only = None if producers is None else set(producers)
        out = [
            e
            for e in [*self.entries.values(), *(e for _, e in self.delivered.values())]
            if e.pipeline_id == pipeline_id and (only is None or e.producer in only)
        ]
        for e in out:
            self._remove(e)
        return out

    def expire(self) -> list[Retained]:
        """Outputs past `max_age_s` (returned), and delivered ones past their keep (not
        returned: they were let go at delivery)."""
        now = self.clock()
        cutoff = now - self.max_age_s
        out = [e for e in self.entries.values() if e.created < cutoff]
        for e in out:
            self._remove(e)
        while self.delivered:
            at, e = next(iter(self.delivered.values()))
            if at > now - DELIVERED_KEEP_S and e.created >= cutoff:
                break
            self._remove(e)
        return out

    def fit_memory(self) -> None:
        """Bring memory back within `memory_bytes` after a `put(hold=True)`: the newest
        outputs in memory, delivered ones too, are spilled until the rest fit."""
        kept = [*self.entries.values(), *(e for _, e in self.delivered.values())]
        held = sorted((e for e in kept if e.data is not None), key=lambda e: e.created)
        while held and self.memory > self.memory_bytes:
            e = held.pop()
            data, e.data = e.data, None
            assert data is not None
            self.memory -= len(data)
            self._spill(e, data)

    def spill_all(self) -> None:
        """Write what is only in memory to disk (before a shutdown), so a restart finds it."""
        for e in self.entries.values():
            if e.data is not None:
                data, e.data = e.data, None
                self.memory -= len(data)
                self._spill(e, data)

    def set_object(self, entry: Retained, object_key: str | None) -> None:
        entry.object_key = object_key
        self._save_meta(entry)

    # -- disk -----------------------------------------------------------------------------------
    def _name(self, entry: Retained) -> str:
        return hashlib.sha256(f"{entry.pipeline_id}/{entry.producer}".encode()).hexdigest()[:32]

    def _spill(self, entry: Retained, data: bytes) -> None:
        path = self.dir / f"{self._name(entry)}.bin"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        entry.path = path
        self._save_meta(entry)

    def _save_meta(self, entry: Retained) -> None:
        if entry.path is None:
            return
        meta = entry.path.with_suffix(".json")
        tmp = meta.with_suffix(".jtmp")
        tmp.write_text(json.dumps(entry.meta()))
        os.replace(tmp, meta)

    def _remove(self, entry: Retained) -> None:
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
            self.bytes -= entry.size
        elif (kept := self.delivered.get(entry.key)) is not None and kept[1] is entry:
            del self.delivered[entry.key]
            self.bytes -= entry.size
        if entry.data is not None:
            self.memory -= entry.size
            entry.data = None
        if entry.path is not None:
            for p in (entry.path, entry.path.with_suffix(".json")):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            entry.path = None

    def _reload(self) -> None:
        for meta in sorted(self.dir.glob("*.json")):
            path = meta.with_suffix(".bin")
            try:
                m = json.loads(meta.read_text())
                entry = Retained(
                    str(m["pipeline_id"]),
                    str(m["producer"]),
                    int(m["token"]),
                    str(m["sha256"]),
                    int(m["size"]),
                    {str(k): str(v) for k, v in dict(m["consumers"]).items()},
                    {str(a) for a in m["acked"]},
                    float(m["created"]),
                    None,
                    path,
                    str(m["object_key"]) if m.get("object_key") else None,
                    _media_type(m.get("media_type")),
                )
                if path.stat().st_size != entry.size:
                    raise ValueError("size differs from its sidecar")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable retained output %s: %s", meta.name, exc)
                for p in (meta, path):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                continue
            if entry.unacked():
                self.entries[entry.key] = entry
            else:  # delivered to all before the restart
                self.delivered[entry.key] = (self.clock(), entry)
            self.bytes += entry.size
        orphans = [b for b in self.dir.glob("*.bin") if not b.with_suffix(".json").exists()]
        for stray in [*self.dir.glob("*.tmp"), *self.dir.glob("*.jtmp"), *orphans]:
            with contextlib.suppress(FileNotFoundError):
                stray.unlink()


def _media_type(raw: Any) -> MediaType | None:
    """A sidecar's media type; one this release does not know (or none, from a release
    that kept none) is None: the consumer goes by the bytes."""
    return raw if raw in get_args(MediaType) else None
