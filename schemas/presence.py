"""How MARS knows an agent is there: the settings shared by the agent, the orchestrator and every
nats-server configuration MARS writes (the embedded server, `mars deploy`).

NATS is the primary presence signal (docs/recovery.md, "Detection"):

- a crash closes the agent's connection: the server's DISCONNECT advisory, within milliseconds;
- a silent link or a hung process (TCP open, nothing answered) is found by the server's own
  PING/PONG: it pings a connection that sent nothing for `PING_INTERVAL` and closes it once
  `PING_MAX` pings are unanswered, which is a DISCONNECT advisory too (reason "Stale
  Connection"), between `PING_MAX` and `PING_MAX + 1` intervals after the link fell silent;
- heartbeats are a sparse backstop (`DEFAULT_HEARTBEAT_S`, each agent advertises its own):
  they find what the server cannot tell, e.g. agents that share one connection, or a server
  whose advisories do not reach the orchestrator.

The ping settings are global to a nats-server (every client, route and leaf connection).
"""

from __future__ import annotations

#: nats-server `ping_interval` (a Go duration: sub-second values are accepted).
PING_INTERVAL = "500ms"
#: nats-server `ping_max`: pings outstanding before the server closes the connection.
PING_MAX = 2
PING_INTERVAL_S = 0.5
#: The lines to put in a nats-server configuration (top level).
PING_CONF = f'ping_interval: "{PING_INTERVAL}"\nping_max: {PING_MAX}\n'
#: Longest silence before the server closes a connection, nominally (its timers add a little).
SILENT_DETECTION_S = (PING_MAX + 1) * PING_INTERVAL_S

#: Default agent heartbeat interval: a backstop, not the primary signal (was 0.5 s).
DEFAULT_HEARTBEAT_S = 10.0
