"""nats-server's connection advisories, as far as MARS reads them.

The server publishes `$SYS.ACCOUNT.<account>.CONNECT` and `.DISCONNECT` as JSON with many more
fields than these; unlike MARS's own messages (closed models), unknown fields are ignored
here, since the server's format is not ours to fix.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from schemas.base import WireModel
from schemas.limits import ShortText


class _ServerFormat(WireModel):
    model_config = ConfigDict(extra="ignore")


class AdvisoryClient(_ServerFormat):
    #: The connection id (per server).
    id: Annotated[int, Field(ge=0)]
    #: The name the client connected with (agents: `mars-agent-<id>`): chosen by the
    #: client, so proof of nothing by itself.
    name: ShortText = ""
    #: Who the server authenticated: a client's public nkey in a `mars deploy` setup.
    user: ShortText = ""


class AdvisoryServer(_ServerFormat):
    id: ShortText = ""


class ConnectionAdvisory(_ServerFormat):
    client: AdvisoryClient
    server: AdvisoryServer = Field(default_factory=lambda: AdvisoryServer())
    #: Why a connection closed (DISCONNECT only): `STALE_CONNECTION` when the server's pings
    #: went unanswered (a silent link, a hung client).
    reason: ShortText = ""


#: The DISCONNECT reason of a connection the server closed for unanswered pings.
STALE_CONNECTION = "Stale Connection"


class ServerConnection(_ServerFormat):
    """One client connection in nats-server's monitoring `/connz` answer."""

    #: The name the client connected with (`mars-orchestrator`, `mars-agent-<id>`, ...).
    name: ShortText = ""
    #: Messages the client sent to the server, and the server delivered to it.
    in_msgs: Annotated[int, Field(ge=0)] = 0
    out_msgs: Annotated[int, Field(ge=0)] = 0


class ServerConnections(_ServerFormat):
    """nats-server's `/connz` answer, as far as the benchmarks read it."""

    connections: Annotated[list[ServerConnection], Field(max_length=1_000_000)] = Field(
        default_factory=list
    )


class ServerStreamState(_ServerFormat):
    #: The stream's last sequence number: every message ever stored in it, deleted or not.
    last_seq: Annotated[int, Field(ge=0)] = 0


class ServerStream(_ServerFormat):
    name: ShortText = ""
    state: ServerStreamState = Field(default_factory=lambda: ServerStreamState())


class ServerAccountStreams(_ServerFormat):
    stream_detail: Annotated[list[ServerStream], Field(max_length=100_000)] = Field(
        default_factory=list
    )


class ServerJetStream(_ServerFormat):
    """nats-server's `/jsz?accounts=true&streams=true` answer, as far as the benchmarks read
    it."""

    account_details: Annotated[list[ServerAccountStreams], Field(max_length=100_000)] = Field(
        default_factory=list
    )
