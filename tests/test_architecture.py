"""The layer rules and import circles, checked on the import graph (grimp, import-linter's).

``lint-imports`` (in .ci/run) enforces the layers in pyproject.toml. This test fails on
any import circle under ``walkeep/`` (``TYPE_CHECKING``-only imports count too); a
circle that has to stay for a while is listed by name below, and one untied must be
deleted from the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

# Circles that remain, each a set of modules importing each other. None: keep it so
# (inject a dependency instead of importing sideways or upward; docs/architecture.md).
KNOWN_CIRCLES: list[frozenset[str]] = []


def _circles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        members.add(m)
                        if m == node:
                            break
                    if len(members) > 1:
                        out.append(frozenset(members))
    return out


def test_no_new_import_circles() -> None:
    graph = grimp.build_graph("walkeep", include_external_packages=False)
    found = _circles(graph)
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, f"new import circles (inject instead of importing sideways): {new}"
    untied = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not untied, f"these circles are gone or changed: update KNOWN_CIRCLES: {untied}"


def test_the_circle_finder_finds_circles() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z", "a.w"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    graph.add_import(importer="a.z", imported="a.x")
    graph.add_import(importer="a.z", imported="a.w")
    assert _circles(graph) == [frozenset({"a.x", "a.y", "a.z"})]


# A module longer than this says at the top of its docstring why it is one file.
LONG_MODULE_LINES = 600
WHY_ONE_FILE = "Why one file:"


def _long_modules_without_reason(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if WHY_ONE_FILE not in doc:
            out.append(f"{path.relative_to(root.parent)} ({text.count(chr(10))} lines)")
    return out


def test_long_modules_say_why_they_are_one_file() -> None:
    root = Path(__file__).resolve().parent.parent / "walkeep"
    missing = _long_modules_without_reason(root)
    assert not missing, (
        f"over {LONG_MODULE_LINES} lines with no '{WHY_ONE_FILE} …' in the module docstring "
        f"(split it by idea, or say why not): {missing}"
    )


def test_the_length_check_sees_a_long_module(tmp_path: Path) -> None:
    pkg = tmp_path / "walkeep"
    pkg.mkdir()
    body = "x = 1\n" * (LONG_MODULE_LINES + 1)
    (pkg / "long.py").write_text('"""A long one."""\n' + body)
    (pkg / "kept.py").write_text(f'"""Kept.\n\n{WHY_ONE_FILE} it is one idea."""\n' + body)
    (pkg / "short.py").write_text('"""Short."""\nx = 1\n')
    assert _long_modules_without_reason(pkg) == [f"walkeep/long.py ({LONG_MODULE_LINES + 2} lines)"]
