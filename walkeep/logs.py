"""Logging setup, always on stderr: readable text on a terminal, JSON lines otherwise.

stderr matters: over stdio MCP, stdout is the protocol wire. A person at a terminal
reads ``12:00:01 INFO  walkeep.worker: job done job=renew blobs_renewed=3``; a log
shipper (not a TTY) gets one JSON object per line. ``WALKEEP_LOG_FORMAT=json|text``
overrides the guess.

Redaction: every line is passed through :func:`redact` before it is written, whatever
logger produced it, so a secret that reaches a message, an extra field or a traceback
(a one-time console link in an access-log path, an API key in an exception, a
password in a database URL) is cut down to its recognisable prefix. Logs are read by
more people and kept longer than any of these secrets are meant to live.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import TextIO

_RESERVED = set(vars(logging.makeLogRecord({})))

# Secret-shaped strings, each kept to a prefix that says what it was. Order matters:
# specific shapes first, the generic long-token rule for path segments last.
_KEEP = 4  # characters of an id kept after its prefix, to correlate lines
_SECRETS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Walkeep API keys, one-time console links, alert signing secrets.
    (re.compile(r"\b(wk_(?:live|test)_|wkc_|whsec_)[A-Za-z0-9_\-]{6,}"), r"\1…"),
    # Stripe secret/restricted keys and webhook secrets; Sui private keys.
    (re.compile(r"\b((?:sk|rk)_(?:live|test)_)[A-Za-z0-9]{6,}"), r"\1…"),
    (re.compile(r"\bsuiprivkey1[a-z0-9]{10,}"), "suiprivkey1…"),
    # Bearer credentials, wherever a header value ends up in text.
    (re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]{6,}"), r"\1…"),
    # The password in a URL's userinfo (database URLs in driver errors).
    (re.compile(r"(://[^/\s:@]+:)[^/\s@]+@"), r"\1***@"),
    # Checkout pages are reachable by their id: keep enough of it to correlate.
    (re.compile(rf"(/checkout/[A-Za-z]+_[A-Za-z0-9]{{{_KEEP}}})[A-Za-z0-9]+"), r"\1…"),
    # One-time links under any prefix, e.g. /console/link/<token>.
    (re.compile(r"(/link/)[^/\s?#\"']{6,}"), r"\1…"),
)


def redact(text: str) -> str:
    """``text`` with every secret-shaped part cut to its prefix (see ``_SECRETS``)."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def _clean(value: object) -> object:
    return redact(value) if isinstance(value, str) else value


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {
        k: _clean(v)
        for k, v in vars(record).items()
        if k not in _RESERVED and not k.startswith("_")
    }


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
            # Several web processes (`walkeep serve --workers N`) share one stream.
            "pid": record.process,
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
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
        return redact(line)


def use_json(fmt: str, stream: TextIO) -> bool:
    """``json``/``text`` as configured; ``auto`` means text only on an interactive terminal."""
    if fmt in ("json", "text"):
        return fmt == "json"
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


ACCESS_LOGGER = "walkeep.access"


def access_log_on(mode: str, stream: TextIO | None = None) -> bool:
    """``on``/``off`` as configured; ``auto`` means on unless ``stream`` is a terminal."""
    if mode in ("on", "off"):
        return mode == "on"
    isatty = getattr(stream or sys.stderr, "isatty", None)
    return not (callable(isatty) and isatty())


def access_log(mode: str) -> None:
    """Turn the per-request lines (``walkeep.access``) on or off for this process.

    Why off on a terminal by default: there a person reads the start banner and the
    worker's lines, and a line per request (a polling client: several a second) scrolls
    them away. A log file or shipper gets every line; ``--access-log`` asks for them on a
    terminal too."""
    level = logging.NOTSET if access_log_on(mode) else logging.WARNING
    logging.getLogger(ACCESS_LOGGER).setLevel(level)


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
