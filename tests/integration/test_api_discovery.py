"""The API's `nats.micro` service is discoverable (`$SRV` PING, INFO, STATS) only once every
endpoint is there: a client that discovers the endpoints as the orchestrator comes up never
sees a service without them. Over a real nats-server, read from its monitoring port."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from orchestrator.infra.natsserver import EmbeddedNats
from orchestrator.service import Orchestrator
from schemas import subjects

pytestmark = pytest.mark.integration

ENDPOINTS = {
    "submit": subjects.SUBMIT,
    "status": subjects.STATUS,
    "list": subjects.LIST,
    "cancel": subjects.CANCEL,
    "agents": subjects.AGENTS,
    # the same as one user asks them: mars.v1.api.<op>.<user> (orchestrator/api/users.py)
    "submit-user": subjects.api_users(subjects.SUBMIT),
    "status-user": subjects.api_users(subjects.STATUS),
    "list-user": subjects.api_users(subjects.LIST),
    "cancel-user": subjects.api_users(subjects.CANCEL),
    "agents-user": subjects.api_users(subjects.AGENTS),
}


@pytest.fixture
def monitored(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(store_dir=str(tmp_path / "nats"), monitor=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def subscriptions(server: EmbeddedNats, name: str) -> list[dict[str, Any]]:
    """Every subscription of the connection called `name`, as the server holds them."""
    url = f"http://{server.host}:{server.monitor_port}/connz?subs=detail&limit=1000"
    with urllib.request.urlopen(url, timeout=10) as resp:  # loopback only
        connz = json.load(resp)
    (conn,) = [c for c in connz["connections"] if c.get("name") == name]
    subs: list[dict[str, Any]] = conn["subscriptions_list_detail"]
    return subs


async def test_the_api_service_is_visible_only_with_every_endpoint(
    monitored: EmbeddedNats,
) -> None:
    """The server takes one connection's subscriptions in the order they were sent (their
    sids): every endpoint's came before any of the service's `$SRV` subjects, so no PING or
    INFO could be answered while an endpoint was missing, and INFO names them all. Before,
    `nats.micro.add_service` made the service visible first and the endpoints were added
    after it: a client asking as the orchestrator came up was told of none."""
    orch = Orchestrator(monitored.url)
    await orch.start()
    nc = await nats.connect(monitored.url)
    try:
        msg = await nc.request(f"$SRV.INFO.{subjects.API_SERVICE}", b"", timeout=5)
        info = json.loads(msg.data)
        assert {e["name"]: e["subject"] for e in info["endpoints"]} == ENDPOINTS
        subs = await asyncio.to_thread(subscriptions, monitored, "mars-orchestrator")
        api = {int(s["sid"]) for s in subs if s["subject"] in ENDPOINTS.values()}
        control = {int(s["sid"]) for s in subs if s["subject"].startswith("$SRV.")}
        assert len(api) == len(ENDPOINTS) and len(control) == 9  # PING, INFO, STATS x 3
        assert max(api) < min(control), sorted((int(s["sid"]), s["subject"]) for s in subs)
    finally:
        await nc.close()
        await orch.stop()
