"""Logging setup, always on stderr: readable text on a terminal, JSON lines otherwise.

stderr matters: over stdio MCP, stdout is the protocol wire. A person at a terminal
reads ``12:00:01 INFO  walkeep.worker: job done job=renew blobs_renewed=3``; a log
shipper (not a TTY) gets one JSON object per line. ``WALKEEP_LOG_FORMAT=json|text``
overrides the guess.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

_RESERVED = set(vars(logging.makeLogRecord({})))


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            # Several web processes (`walkeep serve --workers N`) share one stream.
            "pid": record.process,
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """One short line per record, structured fields as ``key=value`` after the message."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{when} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            line += f"  {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def use_json(fmt: str, stream: TextIO) -> bool:
    """``json``/``text`` as configured; ``auto`` means text only on an interactive terminal."""
    if fmt in ("json", "text"):
        return fmt == "json"
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def setup(level: str = "INFO", *, fmt: str = "auto") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json(fmt, sys.stderr) else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # One INFO line per request from the SDK ("Terminating session: None" on every
    # stateless call) is noise, and costs the request path a formatted write. The
    # scheduler's "Adding job"/"Added job" lines and Alembic's per-start preamble bury
    # the serve banner; the worker logs its own start and its jobs' results.
    for noisy in (
        "apscheduler.executors.default",
        "apscheduler.scheduler",
        "alembic",
        "httpx",
        "mcp.server.streamable_http_manager",
        "mcp.server.streamable_http",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)
