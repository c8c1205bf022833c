"""The README and docs/ say only what is true of the code: commands, options, settings, links.

Every ``walkeep …`` line in a shell block of README.md or docs/*.md is checked against the
real command tree (its command path exists, every ``--option`` it names is one that command
takes), and the ones that run offline in a second are run for real, in a fresh data
directory, in the order the docs give them, and must succeed. The rest are only checked,
because running them here proves nothing more than their own tests do: ``serve``, ``mcp``,
``worker`` and ``devnet`` are servers (tests/test_serve_workers.py, test_bridge.py,
test_devnet_http.py start them), ``smoke`` needs a running server and renewals
(test_smoke*), ``verify`` needs a renewal's digest (test_verify.py), ``alerts set``/``test``
need a webhook receiver (test_alerts.py), ``key revoke`` a key's real prefix.

Every ``WALKEEP_…`` name the docs mention must be a setting, a command option's variable (or
one of the few variables the test suite itself reads), and every relative link must reach a file and, with ``#anchor``,
a heading in it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from walkeep.cli import build_command
from walkeep.config import Settings

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}

# Command paths safe to run offline in a fresh data dir, in the docs' order.
RUNNABLE = {
    (),  # walkeep --version
    ("migrate",),
    ("account", "create"),
    ("account", "show"),
    ("account", "list"),
    ("balance",),
    ("key", "create"),
    ("key", "list"),
    ("credits", "grant"),
    ("statement",),
    ("console-link",),
    ("index", "rebuild"),
}
# Environment variables the docs may name that are not settings: the test suite's own.
NOT_SETTINGS = {"WALKEEP_TEST_DATABASE_URL", "WALKEEP_SCREENSHOTS"}


def _shell_lines(path: Path) -> list[str]:
    """The command lines of the shell blocks of one document (prompts and comments cut)."""
    out: list[str] = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), re.M | re.S):
        if lang not in SHELL:
            continue
        for raw in body.splitlines():
            line = raw.strip().removeprefix("$ ")
            line = re.sub(r"\s+#\s.*$", "", line)
            if line.startswith("walkeep ") or line == "walkeep":
                out.append(line)
    return out


def _documented_commands() -> list[tuple[str, str]]:
    return [(p.relative_to(ROOT).as_posix(), line) for p in DOCS for line in _shell_lines(p)]


def _resolve(root: click.Command, words: list[str]) -> tuple[click.Command, tuple[str, ...]]:
    """The command a line names, and its path; fails on an unknown subcommand."""
    cmd, path = root, ()
    for word in words:
        if word.startswith("-"):
            break
        sub = getattr(cmd, "commands", None)
        if not sub:
            break
        assert word in sub, f"no command `{' '.join(('walkeep', *path, word))}`"
        cmd, path = sub[word], (*path, word)
    return cmd, path


def _options(cmd: click.Command) -> set[str]:
    names = {"--help"}
    for param in cmd.params:
        names.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    return names


def test_the_docs_show_commands_at_all() -> None:
    found = _documented_commands()
    assert len(found) >= 20, found  # the operator CLI block alone has more
    assert any(line.startswith("walkeep verify") for _, line in found)


@pytest.mark.parametrize(("doc", "line"), _documented_commands())
def test_every_documented_command_and_option_exists(doc: str, line: str) -> None:
    root = build_command()
    words = line.replace("[", " ").replace("]", " ").replace("|", " ").split()[1:]
    cmd, _ = _resolve(root, words)
    allowed = _options(cmd)  # the root's own options when the line names no command
    for word in words:
        option = word.split("=", 1)[0]
        if option.startswith("--"):
            assert option in allowed, f"{doc}: `{line}`: `{option}` is not an option of it"


def _literal(line: str) -> list[str] | None:
    """The line with its optional ``[…]`` parts dropped, as argv; None if it is a synopsis
    with placeholders or alternatives rather than a command one could paste."""
    text = re.sub(r"\s*\[[^\]]*\]", "", line)
    if re.search(r"[<>|…]", text):
        return None
    return shlex.split(text)[1:]


def test_the_documented_commands_that_run_offline_succeed(tmp_path: Path) -> None:
    root = build_command()
    env = {"WALKEEP_DATA_DIR": str(tmp_path / "data"), "WALKEEP_DATABASE_URL": ""}
    runner = CliRunner()
    ran: set[tuple[str, ...]] = set()
    for doc, line in _documented_commands():
        argv = _literal(line)
        if argv is None:
            continue
        _, path = _resolve(root, argv)
        if path not in RUNNABLE:
            continue
        result = runner.invoke(root, argv, env=env, catch_exceptions=False)
        assert result.exit_code == 0, f"{doc}: `{line}` failed:\n{result.output}"
        ran.add(path)
    # Each runnable command is shown literally somewhere, and so was run.
    assert ran == RUNNABLE, f"never run (not shown as a pasteable line): {RUNNABLE - ran}"


def _setting_names() -> set[str]:
    names: set[str] = set()
    for name, info in Settings.model_fields.items():
        alias: Any = info.validation_alias
        choices = getattr(alias, "choices", None)
        if choices:
            names.update(str(c) for c in choices)
        names.add(f"WALKEEP_{name.upper()}")
    # and the variables a command option reads (``envvar=``)
    stack: list[click.Command] = [build_command()]
    while stack:
        cmd = stack.pop()
        stack.extend((getattr(cmd, "commands", None) or {}).values())
        for param in cmd.params:
            env = getattr(param, "envvar", None)
            names.update([env] if isinstance(env, str) else list(env or ()))
    return names


def test_every_documented_setting_exists() -> None:
    known = _setting_names() | NOT_SETTINGS
    unknown = []
    for path in DOCS:
        for name in set(re.findall(r"\bWALKEEP_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())):
            if name not in known:
                unknown.append(f"{path.relative_to(ROOT)}: {name}")
    assert not unknown, unknown


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), re.M)}


def _broken_links(paths: list[Path]) -> list[str]:
    """Relative links (outside code blocks) to a missing file, or to a missing heading."""
    broken = []
    for path in paths:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading)")
    return broken


def test_every_relative_link_resolves() -> None:
    broken = _broken_links(DOCS)
    assert not broken, broken


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "a.md"
    doc.write_text(
        "# Title here\n\n[ok](#title-here) [bad](#nowhere) [gone](missing.md) "
        "[web](https://example.com)\n\n```\n[in code](nowhere.md)\n```\n"
    )
    assert _broken_links([doc]) == [
        "a.md: #nowhere (no such heading)",
        "a.md: missing.md (no such file)",
    ]


def test_the_readme_is_one_sitting() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move reference material to docs/"
