"""The CLI explains itself: --version, and help with descriptions and no type placeholders.

Walks every command of the real command tree (so commands added later are held to the
same standard) and renders each one's --help as a user sees it.
"""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from typing import Any

import pytest

from walkeep import __version__
from walkeep.cli import build_command, main

PLACEHOLDER = re.compile(r"<(bool|str|int|float|text|integer|path|choice)[^>]*>", re.I)


def _walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = [(path, command)]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        out += _walk(sub, (*path, name))
    return out


COMMANDS = _walk(build_command())


def test_the_tree_is_walked() -> None:
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"", "serve", "mcp", "worker", "account create", "key revoke"} <= names


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "walkeep")
def test_help_reads_cleanly(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "Usage:" in text
    assert not PLACEHOLDER.search(text), text
    command = dict(COMMANDS)[path]
    assert (command.help or command.short_help or "").strip(), f"{path} has no description"
    for param in command.params:
        assert (getattr(param, "help", None) or "").strip(), f"{path} {param.name}: no help"
    # every option line in the rendered help carries a description
    for line in text.splitlines():
        m = re.match(r"^\W*(--[a-z-]+)(.*?)\W*$", line)
        if m:
            assert len(m.group(2).split()) >= 2, f"option without help: {line!r}"


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "walkeep.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"walkeep {__version__}"


def test_log_format_text_on_a_terminal_json_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from walkeep import logs

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, fmt, want_json in (
        (Tty(), "auto", False),
        (io.StringIO(), "auto", True),
        (Tty(), "json", True),
        (io.StringIO(), "text", False),
    ):
        monkeypatch.setattr(sys, "stderr", stream)
        logs.setup("INFO", fmt=fmt)
        logging.getLogger("walkeep.test").info("hello", extra={"job": "renew"})
        line = stream.getvalue().strip()
        if want_json:
            assert json.loads(line)["job"] == "renew"
        else:
            assert line.endswith("walkeep.test: hello  job=renew"), line
    logging.getLogger().handlers.clear()
