"""The attacks of issue 44, each tried against the secure topology `mars deploy` generates (a
3-node hub cluster, two leaf sites, TLS and an nkey per identity) and each refused.

Every attack is tried by legitimate identities acting hostile (agent b1 at site b, cloud agent
c1 at the hub, user bob, admin ops) and by clients without a usable credential (none, a fresh
random nkey), which the server refuses at connect. The server refuses a hostile identity's
publish or subscription by its permissions (console/deploy/permissions.py) and says so with a
`permissions violation` error on that connection: a publish followed by a flush (a round trip
to the same server, which answers in order) has either been refused by then or not at all, so
the flush is the bounded wait that shows the forbidden message went nowhere. Where the right
layer is the orchestrator (a user's pipelines, an agent claiming another's task on its own
subject), the API's answers and the pipeline's outcome show the refusal.

One topology serves the whole module (it takes ~10 s to start)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nkeys
import pytest
import pytest_asyncio
from nats.aio.client import Client as NATS
from nats.js.errors import NotFoundError

from console.deploy import permissions
from schemas import subjects
from schemas.codec import RemoteError, decode, encode, encoding_of
from schemas.events import TaskEvent
from schemas.pipeline import PipelineSpec
from schemas.recovery import ClusterEvent
from tests.topology import Server, Topology
from transport.client import Client
from transport.connect import Credentials

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]

SITES = {"a": ["a1", "a2"], "b": ["b1"]}
CLOUD = ["c1"]
RESULTS = subjects.RESULTS_BUCKET
BOOKINGS = "MARS_BOOKINGS"  # orchestrator/reservations/store.py BUCKET
#: How long the server's log may take to show a line about a connection it already refused.
LOG_WAIT_S = 5.0


@dataclass(frozen=True)
class Who:
    """An attacker: `kind` "agent" or "user" (a real identity of the deployment, acting
    hostile), "nobody" (TLS, no credential) or "forged" (a fresh random nkey); for those two,
    `name` is the server it tries."""

    kind: str
    name: str

    @property
    def credentialed(self) -> bool:
        return self.kind in ("agent", "user")

    def __str__(self) -> str:
        return f"{self.kind}-{self.name}"


B1 = Who("agent", "b1")  # at site b's leaf
C1 = Who("agent", "c1")  # at the hub
BOB = Who("user", "bob")
OPS = Who("user", "ops")  # an admin: still no agent, bookings or result rights
NOBODY = Who("nobody", "h1")
FORGED = Who("forged", "leaf-a")
AGENTS_AND_STRANGERS = [B1, C1, NOBODY, FORGED]
EVERYONE = [B1, C1, BOB, OPS, NOBODY, FORGED]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def topo(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Topology]:
    t = Topology(tmp_path_factory.mktemp("attacks"), SITES, CLOUD)
    try:
        await t.start_servers()
        for h in t.hub_names:
            await t.start_replica(h)
        for a in [*SITES["a"], *SITES["b"], *CLOUD]:
            await t.start_agent(a)
        ops = await admin(t)
        try:
            alive = await ops.wait_for_agents(4, 60)
            assert alive >= 4, f"only {alive} of 4 agents joined"
        finally:
            await ops.close()
        yield t
    finally:
        await t.close()


async def admin(t: Topology) -> Client:
    return Client(await t.connect("user", "ops"), timeout=20.0)


#: How long a refusal may take to be reported after the round trip that follows the attempt:
#: the server sends its `permissions violation` error and the PONG of a flush on different
#: paths, so the error now and then comes just after the PONG (a few % of the time here).
REFUSAL_WAIT_S = 3.0


class Hostile:
    """A connection of a real identity, with the server's errors on it."""

    def __init__(self) -> None:
        self.nc: NATS | None = None
        self.errors: list[str] = []
        #: Each step the server refused, as "<publish|subscription> <subject>", in order.
        self.refused: list[str] = []
        self._news = asyncio.Event()

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(str(exc).lower())
        self._news.set()

    @property
    def conn(self) -> NATS:
        assert self.nc is not None
        return self.nc

    def violated(self, what: str, subject: str) -> bool:
        """The server refused `subject` (or, at the hub, the `$JS.API` subject that its domain
        mapping turns `$JS.hub.API` into before the permissions are checked)."""
        said = [subject.lower()]
        domain = f"$JS.{permissions.HUB_DOMAIN}.API."
        if subject.startswith(domain):
            said.append("$js.api." + subject[len(domain) :].lower())
        return any(
            f'permissions violation for {what} to "{s}"' in e for e in self.errors for s in said
        )

    async def refusal(self, what: str, subject: str) -> None:
        """A round trip to the server, then its refusal of `subject`, awaited (bounded)."""
        await self.conn.flush(timeout=5)
        deadline = asyncio.get_running_loop().time() + REFUSAL_WAIT_S
        while not self.violated(what, subject):
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise AssertionError(f"{what} to {subject} not refused: {self.errors[-3:]}")
            self._news.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), left)
        self.refused.append(f"{what} {subject}")

    async def refused_pub(
        self, subject: str, payload: bytes = b"{}", headers: dict[str, str] | None = None
    ) -> None:
        self.errors.clear()
        await self.conn.publish(subject, payload, headers=headers)
        await self.refusal("publish", subject)

    async def refused_sub(self, subject: str) -> None:
        self.errors.clear()
        sub = await self.conn.subscribe(subject)
        await self.refusal("subscription", subject)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def hostile(t: Topology, who: Who) -> Hostile:
    h = Hostile()
    # unnamed (not `mars-agent-...`): the replicas read agents' connection advisories by name
    h.nc = await t.connect(who.kind, who.name, error_cb=h.on_error)
    return h


def ca_context(t: Topology) -> ssl.SSLContext:
    """Trusts the deployment's CA (public: every identity's bundle carries it)."""
    ctx = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=t.env("user", "bob")["MARS_TLS_CA"]
    )
    return ctx


def random_seed() -> str:
    return str(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())


class LogWatch:
    """What a server logs from now on."""

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.start = srv.log.stat().st_size

    def since(self) -> str:
        with self.srv.log.open("rb") as fh:
            fh.seek(self.start)
            return fh.read().decode(errors="replace")

    async def wait_for(self, *needles: str) -> str:
        """The server writes its log line before it closes the connection it refuses, so this
        is normally there at once; polled (no event to await on a file) for LOG_WAIT_S."""
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            text = self.since()
            for line in text.splitlines():
                if all(n in line for n in needles):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.srv.name} never logged {needles}: {text[-2000:]}")
            await asyncio.sleep(0.02)


async def refused_at_connect(t: Topology, who: Who, seed: str | None = None) -> str:
    """A client without a usable credential is refused with an `Authorization Violation`, and
    the server logs why (its log line)."""
    srv = t.servers[who.name]
    watch = LogWatch(srv)
    kw: dict[str, Any] = {"tls": ca_context(t)}
    key = None
    if who.kind == "forged" or seed is not None:
        seed = seed or random_seed()
        kw["nkeys_seed_str"] = seed
        key = str(nkeys.from_seed(seed.encode()).public_key.decode())
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        nc = await nats.connect(
            f"tls://127.0.0.1:{srv.port}", allow_reconnect=False, connect_timeout=5, **kw
        )
        await nc.close()  # not reached unless the server let it in
    if key is None:
        return await watch.wait_for("authentication error")
    return await watch.wait_for("authentication error", f'Nkey "{key}"')


async def attempt(t: Topology, who: Who, attack: Callable[[Hostile], Awaitable[None]]) -> list[str]:
    """`attack` as `who`: by a real identity, the steps the server refused (each step that
    is not raises); by a client with no usable credential, ["connect"] once the server
    refused it at connect."""
    if not who.credentialed:
        await refused_at_connect(t, who)
        return ["connect"]
    h = await hostile(t, who)
    try:
        await attack(h)
        return h.refused
    finally:
        await h.conn.close()


def all_refused(who: Who, steps: list[str], what: str = "publish") -> list[str]:
    """What `attempt` must come back with: every step refused, in order; or, for a client
    without a credential, its connection."""
    return [f"{what} {s}" for s in steps] if who.credentialed else ["connect"]


def forged_success(
    pid: str, task: str, agent: str, incarnation: str, device: str, token: int
) -> bytes:
    return encode(
        TaskEvent(
            event_id=f"forged-{token}", pipeline_id=pid, task_id=task, agent_id=agent,
            incarnation=incarnation, device_id=device, token=token, state="succeeded",
            output_bytes=1, result="forged",
        ),
        "json",
    )  # fmt: skip


def spanning(name: str, *, seconds: float = 0.05) -> PipelineSpec:
    """Site A -> site A, site B, both -> the cloud (as in test_topology.py)."""
    return PipelineSpec.model_validate(
        {"name": name, "tasks": [
            {"id": "sense", "run": {"kind": "synthetic", "seconds": seconds,
                                    "output_bytes": 1000},
             "requires": {"pinned_agent": "a1"}},
            {"id": "filter", "deps": ["sense"],
             "run": {"kind": "synthetic", "seconds": seconds, "output_bytes": 500},
             "requires": {"pinned_agent": "a2"}},
            {"id": "other", "run": {"kind": "synthetic", "seconds": seconds,
                                    "output_bytes": 700},
             "requires": {"pinned_agent": "b1"}},
            {"id": "merge", "deps": ["filter", "other"],
             "run": {"kind": "synthetic", "seconds": seconds},
             "requires": {"pinned_agent": "c1"}},
        ]}
    )  # fmt: skip


def done(st: Any) -> None:
    assert st.state == "succeeded", (st.state, st.reason, st.placement_log[-5:])
    assert all(t.state == "succeeded" for t in st.tasks)
    assert st.results_committed == len(st.tasks)
    assert {p.task_id: p.agent_id for p in st.plan} == {
        "sense": "a1", "filter": "a2", "other": "b1", "merge": "c1"
    }  # fmt: skip
    for t in st.tasks:
        assert t.result != "forged" and t.output_bytes != 1, t


# -- (1) connecting ------------------------------------------------------------------------------
@pytest.mark.parametrize("server", ["h1", "h3", "leaf-a", "leaf-b"])
async def test_connect_without_credentials(topo: Topology, server: str) -> None:
    line = await refused_at_connect(topo, Who("nobody", server))
    assert "authentication error" in line


@pytest.mark.parametrize("server", ["h2", "leaf-a", "leaf-b"])
async def test_connect_with_a_wrong_nkey(topo: Topology, server: str) -> None:
    """A fresh random seed: a key the deployment never issued (a revoked one reads the same)."""
    line = await refused_at_connect(topo, Who("forged", server))
    assert "authentication error" in line and 'Nkey "U' in line


@pytest.mark.parametrize(("name", "server"), [("a1", "leaf-b"), ("b1", "h1"), ("a1", "h2")])
async def test_agent_credential_elsewhere(topo: Topology, name: str, server: str) -> None:
    """An agent's real key at a server that is not its site's: each server knows only its own
    identities, so a stolen site-A key opens neither site B nor the hub."""
    seed = Path(topo.env("agent", name)["MARS_NKEY_SEED"]).read_text().strip()
    line = await refused_at_connect(topo, Who("agent", server), seed=seed)
    key = str(nkeys.from_seed(seed.encode()).public_key.decode())
    assert "authentication error" in line and key in line


@pytest.mark.parametrize("server", ["h1", "leaf-b"])
async def test_connect_without_tls(topo: Topology, server: str) -> None:
    """Plain text to a TLS port: the server's INFO says TLS is required, and the first bytes
    in the clear (a CONNECT and PING) end the connection at once, unanswered. (nats-server
    2.15 writes no line about it at its default log level; a client that does start TLS
    and then gives up is logged as a `TLS handshake error`, below.)"""
    srv = topo.servers[server]
    reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
    try:
        info = await asyncio.wait_for(reader.readline(), 5)
        assert info.startswith(b"INFO ") and json.loads(info[5:])["tls_required"] is True
        writer.write(b'CONNECT {"verbose":false,"pedantic":false,"name":"plain"}\r\nPING\r\n')
        await writer.drain()
        rest = await asyncio.wait_for(reader.read(), 5)  # until the server closes
        assert rest == b"", rest
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def test_connect_trusting_another_ca(topo: Topology) -> None:
    """A client that does not trust the deployment's CA never completes the handshake (it
    cannot be lured to a server the deployment did not certify either), and the server logs
    the handshake that failed."""
    srv = topo.servers["h2"]
    watch = LogWatch(srv)
    with pytest.raises(ssl.SSLCertVerificationError):
        nc = await nats.connect(
            f"tls://127.0.0.1:{srv.port}", tls=ssl.create_default_context(),
            allow_reconnect=False, connect_timeout=5,
        )  # fmt: skip
        await nc.close()
    await watch.wait_for("TLS handshake error")


# -- (2) forged task events ----------------------------------------------------------------------
@pytest.mark.parametrize("who", [*AGENTS_AND_STRANGERS, BOB, OPS], ids=str)
async def test_forged_task_event_for_another_agent(topo: Topology, who: Who) -> None:
    steps = [
        subjects.task_event("victim-1", "sense", "a1"),
        f"{subjects.EVENTS}.task.victim-1.sense",  # the older form, naming nobody
        f"{subjects.EVENTS}.pipeline.victim-1",
        subjects.input_gone("victim-1", "a1"),
    ]

    async def attack(h: Hostile) -> None:
        ev = forged_success("victim-1", "sense", "a1", "inc", "cpu0", 1)
        for subject in steps:
            await h.refused_pub(subject, ev)

    assert await attempt(topo, who, attack) == all_refused(who, steps)


async def test_own_subject_claiming_another_agents_task(topo: Topology) -> None:
    """b1 may publish task events naming itself: one that claims a1's running task (a1's real
    incarnation and device, every likely token) is dropped by the orchestrator, and the task's
    result is a1's own."""
    ops = await admin(topo)
    alice = Client(await topo.connect("user", "alice"), timeout=20.0, user="alice")
    h = await hostile(topo, B1)
    watch = await topo.connect("replica", "h1")
    try:
        a1 = next(a for a in (await ops.agents()).agents if a.agent_id == "a1")
        rep = await alice.submit(spanning("claim", seconds=1.0))
        pid = rep.pipeline_id
        started = asyncio.Event()

        async def on_event(msg: Any) -> None:
            if msg.subject.startswith(f"{subjects.EVENTS}.task.{pid}.sense."):
                started.set()

        await watch.subscribe(subjects.task_events_of(pid), cb=on_event)
        await asyncio.wait_for(started.wait(), 30)
        for token in range(64):
            for dev in (d.split(":")[0] for d in a1.devices):
                ev = forged_success(pid, "sense", "a1", a1.incarnation, dev, token)
                await h.conn.publish(subjects.task_event(pid, "sense", "b1"), ev)
        await h.conn.flush(timeout=5)
        assert not h.errors, "b1 may publish on its own subject: the orchestrator must drop it"
        st = await alice.wait(pid, 60)
        done(st)
        sense = next(t for t in st.tasks if t.task_id == "sense")
        assert sense.output_bytes == 1000 and (sense.duration_s or 0) >= 0.9, sense
    finally:
        await watch.close()
        await h.conn.close()
        await alice.close()
        await ops.close()


# -- (3) results ---------------------------------------------------------------------------------
@pytest.mark.parametrize("who", EVERYONE, ids=str)
async def test_forged_result_prewritten(topo: Topology, who: Who) -> None:
    key = "victim-2.0"

    async def attack(h: Hostile) -> None:
        ev = forged_success("victim-2", "sense", "a1", "inc", "cpu0", 1)
        await h.refused_pub(f"$KV.{RESULTS}.{key}", ev)
        for api in ("$JS.API", "$JS.hub.API"):
            await h.refused_pub(f"{api}.STREAM.PURGE.KV_{RESULTS}")
            await h.refused_pub(f"{api}.STREAM.MSG.DELETE.KV_{RESULTS}", b'{"seq":1}')
            await h.refused_pub(f"{api}.STREAM.DELETE.KV_{RESULTS}")

    await attempt(topo, who, attack)
    nc = await topo.connect("replica", "h1")
    try:
        kv = await topo.js(nc).key_value(RESULTS)
        with pytest.raises(NotFoundError):
            await kv.get(key)
    finally:
        await nc.close()


# -- (4) fake agents -----------------------------------------------------------------------------
@pytest.mark.parametrize("who", [*AGENTS_AND_STRANGERS, BOB, OPS], ids=str)
async def test_fake_agent_advertising(topo: Topology, who: Who) -> None:
    huge = json.dumps({"agent_id": "evil", "devices": [{"kind": "gpu", "tflops": 1e6}]}).encode()

    async def attack(h: Hostile) -> None:
        for agent in ("a1", "evil"):
            await h.refused_pub(subjects.advert(agent), huge)
            await h.refused_pub(subjects.heartbeat(agent), b"{}")
            await h.refused_pub(subjects.drift(agent), b"{}")

    await attempt(topo, who, attack)
    ops = await admin(topo)
    try:
        assert "evil" not in {a.agent_id for a in (await ops.agents()).agents}
    finally:
        await ops.close()


# -- (5) bookings --------------------------------------------------------------------------------
@pytest.mark.parametrize("who", EVERYONE, ids=str)
async def test_bookings_written_or_wiped(topo: Topology, who: Who) -> None:
    key = f"$KV.{BOOKINGS}.dev.a1.cpu0"

    async def attack(h: Hostile) -> None:
        await h.refused_pub(key, b'{"pipeline":"hog","until_s":3600}')  # booked for an hour
        await h.refused_pub(key, b"", headers={"KV-Operation": "DEL"})
        await h.refused_pub(key, b"", headers={"KV-Operation": "PURGE", "Nats-Rollup": "sub"})
        await h.refused_pub(f"$KV.{BOOKINGS}.>", b"", headers={"KV-Operation": "PURGE"})
        for api in ("$JS.API", "$JS.hub.API"):
            for op in ("PURGE", "DELETE", "UPDATE"):
                await h.refused_pub(f"{api}.STREAM.{op}.KV_{BOOKINGS}")

    await attempt(topo, who, attack)
    nc = await topo.connect("replica", "h1")
    try:
        info = await topo.js(nc).stream_info(f"KV_{BOOKINGS}")
        assert info.config.name == f"KV_{BOOKINGS}"
    finally:
        await nc.close()


# -- (6) another user's pipeline -----------------------------------------------------------------
async def test_other_users_pipeline(topo: Topology) -> None:
    """bob is answered about alice's pipeline as about one that does not exist, cannot cancel
    it, cannot ask on alice's or the admin's subjects nor hear alice's events; alice's
    pipeline completes."""
    alice = Client(await topo.connect("user", "alice"), timeout=20.0, user="alice")
    bob = Client(await topo.connect("user", "bob"), timeout=5.0, user="bob")
    h = await hostile(topo, BOB)
    try:
        rep = await alice.submit(spanning("alices", seconds=0.5))
        pid = rep.pipeline_id
        for asked in (bob.status(pid), bob.cancel(pid, "mine now")):
            with pytest.raises(RemoteError) as err:
                await asked
            assert err.value.envelope.code == "not_found"
        assert pid not in {p.pipeline_id for p in (await bob.list()).pipelines}
        for op in (subjects.STATUS, subjects.CANCEL, subjects.LIST, subjects.SUBMIT):
            await h.refused_pub(op, b"{}")  # the admin's: every pipeline
            await h.refused_pub(subjects.api_as(op, "alice"), b"{}")
        await h.refused_pub("$SRV.INFO.mars-api")
        for sub in (
            f"{subjects.PREFIX}.users.alice.>",
            subjects.pipeline_event(pid),
            subjects.ALL_PIPELINE_EVENTS,
            subjects.task_events_of(pid),
            "_INBOX_alice.>",
        ):
            await h.refused_sub(sub)
        done(await alice.wait(pid, 60))
    finally:
        await h.conn.close()
        await bob.close()
        await alice.close()


@pytest.mark.parametrize("who", AGENTS_AND_STRANGERS, ids=str)
async def test_api_as_someone_else(topo: Topology, who: Who) -> None:
    ops = (subjects.STATUS, subjects.CANCEL, subjects.SUBMIT)
    steps = [s for op in ops for s in (op, subjects.api_as(op, "alice"))]

    async def attack(h: Hostile) -> None:
        for subject in steps:
            await h.refused_pub(subject, b"{}")

    assert await attempt(topo, who, attack) == all_refused(who, steps)


# -- (7) offers and commits straight to an agent -------------------------------------------------
@pytest.mark.parametrize("who", EVERYONE, ids=str)
async def test_commands_straight_to_an_agent(topo: Topology, who: Who) -> None:
    steps = [
        cmd(agent)
        for cmd in (
            subjects.offer, subjects.offers, subjects.commit, subjects.cancel, subjects.drain,
            subjects.job,
        )
        for agent in ("a1", "b1", "c1")
    ]  # fmt: skip

    async def attack(h: Hostile) -> None:
        for subject in steps:
            await h.refused_pub(subject, b"{}")

    assert await attempt(topo, who, attack) == all_refused(who, steps)


# -- (8) forged $SYS advisories ------------------------------------------------------------------
@pytest.mark.parametrize("who", EVERYONE, ids=str)
async def test_forged_sys_advisory(topo: Topology, who: Who) -> None:
    adv = json.dumps(
        {"type": "io.nats.server.advisory.v1.client_disconnect", "id": "x",
         "timestamp": "2026-01-01T00:00:00Z",
         "server": {"name": "h1", "id": "NFAKE"},
         "client": {"id": 1, "name": "mars-agent-a1", "acc": "APP"}, "reason": "Client Closed"}
    ).encode()  # fmt: skip

    async def attack(h: Hostile) -> None:
        for kind in ("DISCONNECT", "CONNECT"):
            await h.refused_pub(f"$SYS.ACCOUNT.APP.{kind}", adv)
        await h.refused_pub("$SYS.REQ.SERVER.PING")

    await attempt(topo, who, attack)
    ops = await admin(topo)
    try:
        a1 = next(a for a in (await ops.agents()).agents if a.agent_id == "a1")
        assert a1.alive
    finally:
        await ops.close()


# -- (9) forged input bytes ----------------------------------------------------------------------
@pytest.mark.parametrize("who", [*AGENTS_AND_STRANGERS, BOB, OPS], ids=str)
async def test_forged_input_bytes(topo: Topology, who: Who) -> None:
    steps = [
        subjects.data_from("a2", "a1"),
        subjects.data("a2"),  # the older form, unnamed
        subjects.data_ack_from("a1", "a2"),
    ]

    async def attack(h: Hostile) -> None:
        for subject in steps:
            await h.refused_pub(subject, b"forged bytes")

    assert await attempt(topo, who, attack) == all_refused(who, steps)


# -- (10) reading what is addressed to others ----------------------------------------------------
@pytest.mark.parametrize("who", [*AGENTS_AND_STRANGERS, BOB, OPS], ids=str)
async def test_subscribing_to_others(topo: Topology, who: Who) -> None:
    steps = [
        "_INBOX_a1.>", "_INBOX_h1.>", "_INBOX.>", ">",
        f"{subjects.PREFIX}.agents.a1.>", subjects.offer("a1"),
        f"{subjects.PREFIX}.agents.*.cmd.>", subjects.all_data_to("a2"),
        subjects.ALL_TASK_EVENTS, "$SYS.>", f"$KV.{RESULTS}.>",
    ]  # fmt: skip

    async def attack(h: Hostile) -> None:
        for subject in steps:
            await h.refused_sub(subject)

    assert await attempt(topo, who, attack) == all_refused(who, steps, "subscription")


# -- (11) agent subjects and JetStream administration --------------------------------------------
@pytest.mark.parametrize("who", EVERYONE, ids=str)
async def test_streams_created_or_deleted(topo: Topology, who: Who) -> None:
    async def attack(h: Hostile) -> None:
        for api in ("$JS.API", "$JS.hub.API"):
            await h.refused_pub(f"{api}.STREAM.DELETE.{subjects.EVENTS_STREAM}")
            await h.refused_pub(f"{api}.STREAM.PURGE.{subjects.EVENTS_STREAM}")
            await h.refused_pub(f"{api}.STREAM.CREATE.X", b'{"name":"X","subjects":[">"]}')
            await h.refused_pub(f"{api}.CONSUMER.CREATE.{subjects.EVENTS_STREAM}")
            await h.refused_pub(f"{api}.STREAM.DELETE.OBJ_{subjects.OUTPUTS_BUCKET}")

    await attempt(topo, who, attack)
    nc = await topo.connect("replica", "h1")
    try:
        js = topo.js(nc)
        assert (await js.stream_info(subjects.EVENTS_STREAM)).config.name == subjects.EVENTS_STREAM
        with pytest.raises(NotFoundError):
            await js.stream_info("X")
    finally:
        await nc.close()


@pytest.mark.parametrize("who", [BOB, OPS], ids=str)
async def test_user_on_agent_subjects(topo: Topology, who: Who) -> None:
    steps = [
        subjects.advert("a1"), subjects.heartbeat("a1"),
        subjects.task_event("p", "t", "a1"), subjects.data_from("a2", "a1"),
        subjects.fetch("a1"), subjects.probe("a1"), subjects.DISCOVER,
        subjects.CLUSTER_EVENTS, subjects.replica_cancel("h1"),
    ]  # fmt: skip

    async def attack(h: Hostile) -> None:
        for subject in steps:
            await h.refused_pub(subject)

    assert await attempt(topo, who, attack) == all_refused(who, steps)


# -- (12) the pipeline beside an attacker --------------------------------------------------------
async def test_pipeline_completes_beside_attacker(topo: Topology) -> None:
    """b1's identity throws several attacks at once, and a client without credentials keeps
    trying to connect, while a pipeline spanning both sites and the cloud runs: it completes
    with every task run where planned, no forged result taken."""
    ops = await admin(topo)
    alice = Client(await topo.connect("user", "alice"), timeout=20.0, user="alice")
    h = await hostile(topo, B1)
    refused_connects = 0
    try:
        a1 = next(a for a in (await ops.agents()).agents if a.agent_id == "a1")
        rep = await alice.submit(spanning("besieged", seconds=0.5))
        pid = rep.pipeline_id
        dev = a1.devices[0].split(":")[0]
        claim = forged_success(pid, "sense", "a1", a1.incarnation, dev, 1)
        forged = [
            (subjects.task_event(pid, "sense", "a1"), claim),
            (subjects.advert("evil"), b"{}"),
            (subjects.commit("a1"), b"{}"),
            (subjects.data_from("a2", "a1"), b"forged bytes"),
            (f"$KV.{RESULTS}.{pid}.0", b"{}"),
            (f"$JS.hub.API.STREAM.PURGE.KV_{BOOKINGS}", b""),
            ("$SYS.ACCOUNT.APP.DISCONNECT", b"{}"),
        ]  # fmt: skip
        stop = asyncio.Event()

        async def hammer() -> None:
            while not stop.is_set():
                for token in range(4):
                    ev = forged_success(pid, "sense", "a1", a1.incarnation, dev, token)
                    await h.conn.publish(subjects.task_event(pid, "sense", "b1"), ev)
                for subject, payload in forged:
                    await h.conn.publish(subject, payload)
                await h.conn.flush(timeout=5)

        async def knock() -> None:
            nonlocal refused_connects
            while not stop.is_set():
                with pytest.raises(nats.errors.Error, match="Authorization Violation"):
                    nc = await nats.connect(
                        f"tls://127.0.0.1:{topo.servers['h1'].port}", tls=ca_context(topo),
                        allow_reconnect=False, connect_timeout=5,
                    )  # fmt: skip
                    await nc.close()
                refused_connects += 1

        tasks = [asyncio.create_task(hammer()), asyncio.create_task(knock())]
        try:
            st = await alice.wait(pid, 90)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        done(st)
        assert refused_connects > 0
        for subject, _ in forged:
            await h.refusal("publish", subject)
    finally:
        await h.conn.close()
        await alice.close()
        await ops.close()


# -- (8b) a real advisory for a connection named as another agent ---------------------------------
#: How long replicas are given to declare a1 dead after the spoofing connection closes: they
#: do it within milliseconds of the advisory when they believe it (this bound shows that they
#: do not).
SPOOF_WAIT_S = 1.5


async def test_connection_named_as_another_agent(topo: Topology) -> None:
    """Last in the module: when it succeeds, a1 is declared dead (and soon rejoins)."""
    watch = await topo.connect("replica", "h1")
    dead = asyncio.Event()

    async def on_cluster(msg: Any) -> None:
        ev = decode(msg.data, ClusterEvent, encoding_of(msg.headers))
        if ev.kind == "agent_dead" and "a1" in ev.agents:
            dead.set()

    ops = await admin(topo)
    try:
        await watch.subscribe(subjects.CLUSTER_EVENTS, cb=on_cluster)
        await watch.flush()
        e = topo.env("agent", "b1")
        creds = Credentials(e["MARS_NKEY_SEED"], e["MARS_TLS_CA"], e["MARS_INBOX_PREFIX"])
        nc = await nats.connect(
            e["MARS_NATS_URL"].split(","), name="mars-agent-a1", allow_reconnect=False,
            **creds.options(),
        )  # fmt: skip
        await nc.flush()
        await nc.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(dead.wait(), SPOOF_WAIT_S)  # the bound: see SPOOF_WAIT_S
        assert not dead.is_set(), "a1 declared dead by b1's connection named as a1"
    finally:
        await ops.wait_for_agents(4, 30)  # a1 back in the view for whatever follows
        await ops.close()
        await watch.close()
