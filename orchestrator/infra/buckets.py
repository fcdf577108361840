"""The object stores and the names bucket that agents and users write or read, made by a
replica in a secure deployment, where only the control plane may create streams.

On the open single-machine server the first agent or client to need one makes it with its
own limits, as before; these are the same defaults.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from nats.js.api import ObjectStoreConfig
from nats.js.errors import BucketNotFoundError

from orchestrator.reliability import ownership
from schemas import subjects
from transport import connect

log = logging.getLogger("mars.orchestrator")
#: As the agents' defaults (edge_agent/config.py): outputs crossing sites live an hour, 1 GiB.
DATA_TTL_S = 3600.0
DATA_MAX_BYTES = 1 << 30


async def ensure(js: Any) -> None:
    r = connect.js_replicas()
    stores = (
        (subjects.DATA_BUCKET, "MARS task outputs above the inline threshold", DATA_TTL_S,
         DATA_MAX_BYTES),
        (subjects.OUTPUTS_BUCKET, "MARS task outputs, for their pipelines' retention",
         ownership.KEEP_S, -1),
        (subjects.INPUTS_BUCKET, "MARS pipeline inputs, by sha256", ownership.KEEP_S, -1),
        (subjects.ARTIFACTS_BUCKET, "MARS artifacts (models, Python bundles) by sha256", None,
         -1),
    )  # fmt: skip
    for name, what, ttl, max_bytes in stores:
        try:
            await js.object_store(name)
        except BucketNotFoundError:
            cfg = ObjectStoreConfig(description=what, ttl=ttl, max_bytes=max_bytes, replicas=r)
            with contextlib.suppress(Exception):  # another replica made it meanwhile
                await js.create_object_store(name, config=cfg)
                log.info("object store %s created (%d replicas)", name, r)
    try:
        await js.key_value(subjects.ARTIFACT_NAMES_BUCKET)
    except BucketNotFoundError:
        with contextlib.suppress(Exception):
            await js.create_key_value(bucket=subjects.ARTIFACT_NAMES_BUCKET, history=1, replicas=r)
