"""systemd units for a deployed machine: the nats-server (hub node or site leaf), an
orchestrator replica, an agent. Each runs as the unprivileged user `mars`, reads its identity
from the prefix (`/etc/mars`) and writes only under the state directory (`/var/lib/mars`)."""

from __future__ import annotations

from pathlib import Path

from console.deploy.files import DEFAULT_PREFIX, DEFAULT_STATE
from console.deploy.files import write as _write

HARDENING = """User=mars
Group=mars
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ReadWritePaths={state}
"""


def nats_unit(prefix: str, state: str) -> str:
    return f"""[Unit]
Description=MARS nats-server (hub node or site leaf)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/opt/mars/.venv/bin/nats-server -c {prefix}/nats.conf
# `systemctl reload mars-nats` after `mars deploy` added or revoked an identity
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
RestartSec=1
LimitNOFILE=65536
{HARDENING.format(state=state)}
[Install]
WantedBy=multi-user.target
"""


def orchestrator_unit(prefix: str, state: str) -> str:
    return f"""[Unit]
Description=MARS orchestrator replica
After=network-online.target mars-nats.service
Wants=network-online.target

[Service]
EnvironmentFile={prefix}/replica/mars.env
ExecStart=/opt/mars/.venv/bin/mars orchestrator --nats ${{MARS_NATS_URL}} --retry-connect
Restart=always
RestartSec=1
{HARDENING.format(state=state)}
[Install]
WantedBy=multi-user.target
"""


def agent_unit(prefix: str, state: str) -> str:
    return f"""[Unit]
Description=MARS edge agent
After=network-online.target
Wants=network-online.target

[Service]
EnvironmentFile={prefix}/mars.env
ExecStart=/opt/mars/.venv/bin/mars agent --nats ${{MARS_NATS_URL}} --retry-connect \\
  --config {prefix}/agent.yaml
Restart=always
RestartSec=1
# SIGTERM: no new work, running tasks get shutdown_grace_s (default 20 s), then cancelled
KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec=30
{HARDENING.format(state=state)}
[Install]
WantedBy=multi-user.target
"""


def write(out: Path, prefix: str | None, state: str | None) -> None:
    prefix = prefix or DEFAULT_PREFIX
    state = state or DEFAULT_STATE
    _write(out / "mars-nats.service", nats_unit(prefix, state))
    _write(out / "mars-orchestrator.service", orchestrator_unit(prefix, state))
    _write(out / "mars-agent.service", agent_unit(prefix, state))
