"""`mars artifact put/ls/rm`: artifacts written straight to JetStream by the CLI (no
orchestrator holds their bytes), in the buckets schemas/artifacts.py describes.

A put writes the name's entry first, then the bytes (streamed from the file in chunks,
skipped when the store already holds that content); a remove deletes the bytes once no name
is left for them, then the entry. So an object is never left without a name, and what an
interrupted put or remove leaves is an entry whose bytes are missing: `ls` shows it so, an
agent refuses it saying so, and a put or remove of it again ends it.

An ONNX model's graph features, read here with the `onnx` package, go into its object's meta
(`schemas.artifacts.features_headers`), so the orchestrator's predictor scores a model it was
never built with as it does a built-in one; a file that does not parse as a graph is stored all
the same, without them. Its entry is the one every release since level 4 reads: agents and
CLIs never parse an object's meta headers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)

from orchestrator.infra.kvwatch import all_keys
from schemas import subjects
from schemas.artifacts import (
    MAX_ARTIFACT_BYTES,
    ArtifactInfo,
    ArtifactKind,
    ModelFeatures,
    features_headers,
    features_of_headers,
    parse_ref,
)
from schemas.codec import DecodeError, decode, encode
from schemas.digests import sha256_file
from transport import connect

CHUNK_BYTES = 128 * 1024
KINDS: tuple[ArtifactKind, ...] = get_args(ArtifactKind)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class ArtifactsError(Exception):
    """What a command cannot do, in words."""


@dataclass(frozen=True)
class Listed:
    info: ArtifactInfo
    #: The store holds its bytes (False: an interrupted put or remove; put it again).
    stored: bool


def kind_of(path: Path) -> ArtifactKind:
    """An artifact's kind from its file: `.onnx` a model, `.zip`/`.whl` a Python bundle."""
    suffix = path.suffix.lower()
    if suffix == ".onnx":
        return "onnx"
    if suffix in (".zip", ".whl"):
        if not zipfile.is_zipfile(path):
            raise ArtifactsError(f"{path}: not a zip archive, so not a Python bundle")
        return "python-bundle"
    raise ArtifactsError(
        f"{path}: its kind is not told by its name (.onnx, .zip, .whl): say --kind "
        f"({' or '.join(KINDS)})"
    )


def default_name(path: Path) -> str:
    """The file's name without its suffix (a wheel's: its distribution), made a valid one."""
    stem = path.name.split("-")[0] if path.suffix.lower() == ".whl" else path.stem
    return re.sub(r"[^A-Za-z0-9_-]", "-", stem)[:128] or "artifact"


def file_digest(path: Path) -> tuple[str, int]:
    """sha256 (hex) and size of a file, read in chunks."""
    return sha256_file(path), path.stat().st_size


def _store_hex(digest: str | None) -> str:
    """The object store's own digest (`SHA-256=<base64url>`) as hex."""
    if not digest or "=" not in digest:
        return ""
    try:
        return base64.urlsafe_b64decode(digest.partition("=")[2]).hex()
    except ValueError:
        return ""


async def _names(js: Any, create: bool) -> Any:
    try:
        return await js.key_value(subjects.ARTIFACT_NAMES_BUCKET)
    except BucketNotFoundError:
        if not create:
            return None
    try:
        return await js.create_key_value(
            bucket=subjects.ARTIFACT_NAMES_BUCKET, history=1, replicas=connect.js_replicas()
        )
    except Exception:  # another put created it first
        return await js.key_value(subjects.ARTIFACT_NAMES_BUCKET)


async def _objects(js: Any, create: bool) -> Any:
    try:
        return await js.object_store(subjects.ARTIFACTS_BUCKET)
    except BucketNotFoundError:
        if not create:
            return None
    cfg = ObjectStoreConfig(
        description="MARS artifacts (models, Python bundles) by sha256",
        replicas=connect.js_replicas(),
    )
    try:
        return await js.create_object_store(subjects.ARTIFACTS_BUCKET, config=cfg)
    except Exception:
        return await js.object_store(subjects.ARTIFACTS_BUCKET)


async def _stored(objects: Any, sha: str, size: int) -> Any:
    """The object's info when the store holds these bytes under `sha`, else None."""
    try:
        info = await objects.get_info(sha)
    except NotFoundError:
        return None
    held = not info.deleted and info.size == size and _store_hex(info.digest) == sha
    return info if held else None


def _meta_subject(sha: str) -> str:
    meta = base64.urlsafe_b64encode(sha.encode()).decode()
    return f"$O.{subjects.ARTIFACTS_BUCKET}.M.{meta}"


def _has_features(info: Any) -> bool:
    try:
        return features_of_headers(info.headers) is not None
    except ValueError:
        return False  # (written over)


async def _add_features(js: Any, sha: str, features: ModelFeatures) -> bool:
    """Put `features` in the meta of the object the store holds under `sha` (one put before
    they were read, or by an older CLI), its bytes untouched: the meta message is written
    again only if it is still the one read (a remove or a put meanwhile: False, nothing
    written), so a removed object never comes back."""
    subject = _meta_subject(sha)
    try:
        msg = await js.get_last_msg(f"OBJ_{subjects.ARTIFACTS_BUCKET}", subject)
        meta = json.loads(msg.data or b"")
        if not isinstance(meta, dict) or meta.get("deleted"):
            return False
        headers = meta.get("headers")
        meta["headers"] = {
            **(headers if isinstance(headers, dict) else {}),
            **features_headers(features),
        }
        await js.publish(
            subject,
            json.dumps(meta).encode(),
            headers={
                "Nats-Rollup": "sub",
                "Nats-Expected-Last-Subject-Sequence": str(msg.seq),
            },
        )
    except (APIError, ValueError):  # gone, not JSON, or written meanwhile
        return False
    return True


def _examine(
    path: Path, name: str | None, kind: ArtifactKind | None
) -> tuple[str, ArtifactKind, str, int]:
    """What a put stores: name, kind, sha256 and size (the file read once, in chunks)."""
    if not path.is_file():
        raise ArtifactsError(f"{path}: no such file")
    name = name or default_name(path)
    if not _NAME.fullmatch(name):
        raise ArtifactsError(f"name {name!r}: 1-128 of A-Z a-z 0-9 _ - only")
    kind = kind or kind_of(path)
    sha, size = file_digest(path)
    if size > MAX_ARTIFACT_BYTES:
        raise ArtifactsError(f"{path}: {size} B, more than an artifact may be")
    return name, kind, sha, size


def model_features(path: Path) -> ModelFeatures:
    """An ONNX model file's graph features, at batch 1 and per batch (orchestrator/predictor/
    features.py). Any model a put accepts (up to MAX_ARTIFACT_BYTES) is read, its graph and
    inline weights only: weights kept in external files are neither opened nor needed.
    Raises whatever the parse raises for a file that is no ONNX graph."""
    import onnx

    from orchestrator.predictor.features import linear_in_batch

    base, per = linear_in_batch(onnx.load(str(path), load_external_data=False))
    return ModelFeatures(base=base.as_dict(), per_batch=per.as_dict())


def _features_or_none(path: Path) -> ModelFeatures | None:
    try:
        return model_features(path)
    except Exception as exc:  # any parse failure: stored all the same, said so
        why = " ".join(str(exc).split())[:300] or type(exc).__name__
        print(
            f"mars artifact put: {path}: its ONNX graph does not parse ({why}); stored "
            "without graph features (the predictor scores its tasks by their declared "
            "profile)",
            file=sys.stderr,
        )
        return None


async def put(
    js: Any, path: Path, *, name: str | None = None, kind: ArtifactKind | None = None
) -> tuple[ArtifactInfo, bool]:
    """Store the file as an artifact: its entry and whether its bytes were sent (False: the
    store held them already). The same file put again under the same name changes nothing.
    An ONNX model's graph features (`model_features`) go into its object's meta, added to
    that of an object stored before without them; one whose graph does not parse is stored
    without them, said so on stderr."""
    named, kind_is, sha, size = await asyncio.to_thread(_examine, path, name, kind)
    features = await asyncio.to_thread(_features_or_none, path) if kind_is == "onnx" else None
    names, objects = await _names(js, True), await _objects(js, True)
    key = subjects.artifact_key(named, sha)
    info = ArtifactInfo(name=named, sha256=sha, size=size, kind=kind_is, created=time.time())
    created = True
    try:
        await names.create(key, encode(info))
    except KeyWrongLastSequenceError:  # put before: that entry stands
        created = False
        info = decode((await names.get(key)).value or b"", ArtifactInfo)
    held = await _stored(objects, sha, size)
    if held is not None:
        if (
            features is not None
            and not _has_features(held)
            and not await _add_features(js, sha, features)
        ):
            print(
                f"mars artifact put: {path}: its object changed while its graph features "
                "were added to it; put it again to add them",
                file=sys.stderr,
            )
        return info, False
    try:
        opts = ObjectMetaOptions(max_chunk_size=CHUNK_BYTES)
        meta = ObjectMeta(
            name=sha,
            description=f"{kind_is} {named}",
            headers=features_headers(features) if features is not None else None,
            options=opts,
        )
        fh = await asyncio.to_thread(open, path, "rb")
        try:  # read in chunks, in worker threads (nats-py's put of a file)
            got = await objects.put(sha, fh, meta=meta)
        finally:
            fh.close()
        if _store_hex(got.digest) != sha or got.size != size:
            await _delete_object(js, objects, sha)
            raise ArtifactsError(f"{path} changed while it was put: put it again")
    except BaseException:
        if created:  # nothing of this put is left behind
            await _purge_key(js, key)
        raise
    return info, True


async def listing(js: Any) -> list[Listed]:
    """Every name given to an artifact, by name then time of its put."""
    names = await _names(js, False)
    if names is None:
        return []
    keys = await all_keys(names)
    if keys is None:
        raise ArtifactsError("the names bucket holds entries that could not be listed")
    entries: list[ArtifactInfo] = []
    for key in keys:
        try:
            entries.append(decode((await names.get(key)).value or b"", ArtifactInfo))
        except (NotFoundError, DecodeError):
            continue  # removed meanwhile, or not one of ours
    objects = await _objects(js, False)
    held: dict[str, tuple[int, str]] = {}
    if objects is not None:
        try:
            for o in await objects.list(ignore_deletes=True):
                held[o.name] = (o.size or 0, _store_hex(o.digest))
        except NotFoundError:
            pass
    return [
        Listed(e, held.get(e.sha256) == (e.size, e.sha256))
        for e in sorted(entries, key=lambda e: (e.name, e.created))
    ]


def table(listed: list[Listed]) -> str:
    """`mars artifact ls` for people: one line per name given to an artifact."""
    if not listed:
        return "no artifacts"
    lines = []
    for x in listed:
        e = x.info
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.created))
        lines.append(
            f"{e.ref}  {e.kind:<13} {e.size:>12} B  {when}"
            + ("" if x.stored else "  (bytes missing: put it again, or rm it)")
        )
    return "\n".join(lines)


async def remove(js: Any, target: str) -> list[ArtifactInfo]:
    """Remove `NAME@SHA256`, or every artifact named `NAME`; each one's bytes go once no name
    is left for them. Returns what was removed (an error when nothing matched)."""
    ref = parse_ref(target)
    if ref is None and not _NAME.fullmatch(target):
        raise ArtifactsError(f"{target!r} is neither NAME nor NAME@SHA256")
    every = [x.info for x in await listing(js)]
    gone = [e for e in every if target in (e.name, e.ref)]
    if not gone:
        raise ArtifactsError(f"no artifact {target} (`mars artifact ls` lists them)")
    kept = {e.sha256 for e in every if e not in gone}
    objects = await _objects(js, False)
    for info in gone:
        if info.sha256 not in kept and objects is not None:
            await _delete_object(js, objects, info.sha256)
        await _purge_key(js, subjects.artifact_key(info.name, info.sha256))
    return gone


async def _purge_key(js: Any, key: str) -> None:
    """The entry and every trace of it (no delete marker kept)."""
    bucket = subjects.ARTIFACT_NAMES_BUCKET
    await js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}")


async def _delete_object(js: Any, objects: Any, sha: str) -> None:
    """The object's chunks, then its meta (no deleted marker kept)."""
    with contextlib.suppress(NotFoundError):
        await objects.delete(sha)
    meta = base64.urlsafe_b64encode(sha.encode()).decode()
    bucket = subjects.ARTIFACTS_BUCKET
    await js.purge_stream(f"OBJ_{bucket}", subject=f"$O.{bucket}.M.{meta}")
