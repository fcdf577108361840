"""Structured, quiet-by-default logging: one key=value line per record."""

from __future__ import annotations

import logging
import os
import sys
import time


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        msg = record.getMessage().replace('"', "'")
        line = (
            f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f'logger={record.name} msg="{msg}"'
        )
        if record.exc_info:
            line += f' exc="{self.formatException(record.exc_info)!r}"'
        return line


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is when a record comes, not to the one there when the
    handler was made: a host that swaps it (a test harness capturing output) and closes the
    old one must not leave every later record failing on a closed stream."""

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        """`StreamHandler.__init__` sets a stream; this handler has none of its own."""


def _not_tls_eof(record: logging.LogRecord) -> bool:
    return "eof_received()" not in record.getMessage()


def setup(verbosity: int = 0) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    handler = StderrHandler()
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # nats-py logs reconnect chatter at INFO/ERROR; keep it behind -vv
    logging.getLogger("nats").setLevel(logging.DEBUG if verbosity >= 2 else logging.CRITICAL)
    # asyncio warns on every TLS connection nats-py closes ("returning true from
    # eof_received() has no effect when using ssl"): harmless, and it would fill the logs of
    # every process of a secure deployment
    logging.getLogger("asyncio").addFilter(_not_tls_eof)
    # MARS_DEBUG=mars.timing,mars.placement: debug records of just these loggers
    for name in os.environ.get("MARS_DEBUG", "").split(","):
        if name.strip():
            logging.getLogger(name.strip()).setLevel(logging.DEBUG)  # root stays quiet
