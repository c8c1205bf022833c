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
    ("index", "purge"),
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


# --- Pages describe the product as it is ----------------------------------------------------
#
# A run is named by its date and commit. Words about how work on the project was scheduled
# mean nothing to a reader; these patterns find them (written so this file does not match
# itself).
_PERIOD = "stop|session|wave|sprint|iteration"
WORK_PERIOD = re.compile(
    r"\b(?:this|that|the\s+previous|previous|an?\s+earlier|earlier|the\s+next|next|the\s+last"
    r"|last|the\s+same|one)\s+(?:stop|wave|sprint)(?:'s|s'|s)?\b(?!\s+(?:the|a|an|it|its|them"
    r"|renew\w*|serv\w*|accept\w*|word\w*|when|if|once|here)\b)"
    rf"|\b(?:this|previous|earlier|next|last)\s+session(?:'s)?\s+(?:machine|run|figure|change)"
    rf"|\b(?:{_PERIOD})[ -]?#?\d+\b(?!\s*(?:ms|s|%|seconds|minutes|MiB|GiB))"
    r"|\bon\s+(?:the|that)\s+(?:stop|wave)\b",
    re.I,
)
TEXT_SUFFIXES = {".md", ".py", ".toml", ".txt", ".json", ".cfg", ".ini", ".html", ".css", ".sql"}


def _repository_text_files() -> list[Path]:
    """Every text file of the repository a reader may open (git's list when there is one)."""
    try:
        import subprocess

        out = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        files = [ROOT / name for name in out]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if ".git" not in p.parts and "egg-info" not in str(p)]
    return [
        p
        for p in files
        if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in {"Procfile", "LICENSE"})
    ]


def _work_period_words(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in WORK_PERIOD.finditer(line):
                rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                found.append(f"{rel}:{number}: {match.group(0)!r}")
    return found


def test_no_page_names_a_work_period() -> None:
    files = _repository_text_files()
    assert len(files) > 100, "the repository's files were not found"
    found = _work_period_words(files)
    assert not found, "name a run by its date and commit instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("measured on th" + "is stop's machine", True),
        ("the previous sto" + "p: 0.53", True),
        ("on an earlier st" + "op's machine", True),
        ("that st" + "op's machine", True),
        ("figures from the previous st" + "ops, on slower machines", True),
        ("added in wav" + "e 39", True),
        ("merged from wave" + "-41", True),
        ("this sessi" + "on's machine", True),
        ("English stop words are dropped", False),
        ("SIGTERM: this stops the server", False),
        ("renewals stop at the next epoch", False),
        ("the console session ends", False),
        ("a 10 s deadline; stop 5 s later", False),
    ],
)
def test_the_work_period_check_tells_them_apart(tmp_path: Path, text: str, bad: bool) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n{text}\n")
    assert bool(_work_period_words([page])) is bad, text


# --- Figures: every figure the README quotes has its row in docs/benchmarks.md ---------------
BENCH = ROOT / "docs" / "benchmarks.md"


def _readme_figures(text: str) -> list[str]:
    """The README's measured figures: bold runs holding a digit (``**57.5 %**``, ``**~16 ms**``)."""
    bold = re.findall(r"\*\*([^*\n]{1,40}?)\*\*", text)
    return [f.strip().lstrip("~≈<> ") for f in bold if re.search(r"\d", f)]


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|") and "---" not in line]


def _missing_figures(readme: str, bench: str) -> list[str]:
    rows = _table_rows(bench)
    return [f for f in _readme_figures(readme) if not any(f in row for row in rows)]


def test_every_readme_figure_has_a_benchmark_row() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(_readme_figures(readme)) >= 3, "the README's figures are set in bold"
    missing = _missing_figures(readme, BENCH.read_text())
    assert not missing, f"README figures with no row in docs/benchmarks.md: {missing}"


def test_the_figure_check_sees_a_figure_without_a_row() -> None:
    readme = "takes **~16 ms** and finds **57.5 %**; **3 accounts**"
    bench = "| recall | `python bench/x.py` | 57.5 % | 16 ms |\n"
    assert _missing_figures(readme, bench) == ["3 accounts"]


def _git_knows(commit: str) -> bool | None:
    import subprocess

    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
        )
    except OSError:
        return None
    return done.returncode == 0


def test_every_benchmark_table_names_its_run() -> None:
    """Each table says once when, on which commit and on what machine its figures were taken."""
    text = BENCH.read_text()
    blocks = re.split(r"^## ", text, flags=re.M)[1:]
    tables = [b for b in blocks if _table_rows(b)]
    assert len(tables) >= 3, "docs/benchmarks.md lost its tables"
    for block in tables:
        title = block.splitlines()[0]
        run = re.search(r"^Run: (.+)$", block, re.M)
        assert run, f"{title}: no `Run:` line naming date, commit and machine"
        line = run.group(1)
        assert re.search(r"\b\d{1,2} [A-Z][a-z]+ 20\d\d\b", line), f"{title}: no date"
        assert re.search(r"\bcores?\b", line), f"{title}: no machine (cores)"
        commits = re.findall(r"`([0-9a-f]{7,40})`", line)
        assert commits, f"{title}: no commit"
        for commit in commits:
            assert _git_knows(commit) is not False, f"{title}: unknown commit {commit}"


def test_benchmark_and_recall_pages_stay_references() -> None:
    lines = sum(
        (ROOT / "docs" / name).read_text().count("\n") for name in ("benchmarks.md", "recall.md")
    )
    assert lines <= 385, f"docs/benchmarks.md + docs/recall.md: {lines} lines (at most 385)"


# --- Bench commands name scripts and options that exist -------------------------------------
ALL_PAGES = [*DOCS, ROOT / "CHANGELOG.md"]


def _bench_commands(paths: list[Path]) -> list[tuple[str, str, list[str]]]:
    """Each ``python bench/X.py --opt …`` a page shows: (page, script, options)."""
    out = []
    for path in paths:
        for match in re.finditer(r"python\s+(bench/[\w./-]+)([^`\n|]*)", path.read_text()):
            options = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", match.group(2))
            out.append((path.name, match.group(1), options))
    return out


def _bad_bench_commands(paths: list[Path]) -> list[str]:
    bad = []
    for page, script, options in _bench_commands(paths):
        source = ROOT / script
        if not source.is_file():
            bad.append(f"{page}: {script} (no such script)")
            continue
        text = source.read_text()
        for module in re.findall(r"^(?:from|import) (\w+)", text, re.M):
            sibling = source.parent / f"{module}.py"
            text += sibling.read_text() if sibling.is_file() else ""
        for option in options:
            if f'"{option}"' not in text and option != "--help":
                bad.append(f"{page}: {script} {option} (no such option)")
    return bad


def test_every_bench_command_names_a_real_script_and_options() -> None:
    assert len(_bench_commands(ALL_PAGES)) >= 6
    bad = _bad_bench_commands(ALL_PAGES)
    assert not bad, bad


def test_the_bench_check_sees_a_missing_script_or_option(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("`python bench/nope.py` and `python bench/store.py --pg-server X --fast`\n")
    assert _bad_bench_commands([page]) == [
        "p.md: bench/nope.py (no such script)",
        "p.md: bench/store.py --fast (no such option)",
    ]


def test_changelog_links_resolve() -> None:
    broken = _broken_links([ROOT / "CHANGELOG.md"])
    assert not broken, broken
