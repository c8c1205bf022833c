"""Registry metadata and packaging facts that must stay true as the code moves.

server.json is validated against the MCP Registry's published schema (vendored in
tests/schemas/, source noted there); its versions, the package's and the code's come
from the one source, walkeep/__init__.py.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from walkeep import __version__
from walkeep.cli import build_command
from walkeep.config import Settings

ROOT = Path(__file__).resolve().parent.parent
SERVER = json.loads((ROOT / "server.json").read_text())
SCHEMA = json.loads((Path(__file__).parent / "schemas" / "server.schema.json").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_server_json_matches_the_registry_schema() -> None:
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(SERVER), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    assert SERVER["$schema"] == SCHEMA["$id"]


def test_the_schema_check_can_fail() -> None:
    """The vendored schema really constrains: a broken copy is rejected."""
    validator = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
    for broken in (
        {**SERVER, "name": "walkeep"},  # not reverse-DNS
        {**SERVER, "description": "x" * 101},
        {k: v for k, v in SERVER.items() if k != "version"},
        {**SERVER, "packages": [{**SERVER["packages"][0], "version": "latest"}]},
    ):
        assert list(validator.iter_errors(broken))


def test_one_version_source() -> None:
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert "version" not in PYPROJECT["project"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "walkeep.__version__"
    assert SERVER["version"] == __version__
    (pypi,) = [p for p in SERVER["packages"] if p["registryType"] == "pypi"]
    assert pypi["version"] == __version__
    assert pypi["identifier"] == PYPROJECT["project"]["name"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{__version__}]" in changelog


def test_readme_carries_the_registry_marker() -> None:
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"mcp-name: {re.escape(SERVER['name'])}\b", readme)
    assert PYPROJECT["project"]["readme"] == "README.md"  # the marker reaches PyPI


def test_licence_is_declared_once_and_shipped() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert (ROOT / "walkeep" / "py.typed").exists()


def _options(path: tuple[str, ...]) -> set[str]:
    command: Any = build_command()
    for name in path:
        command = command.commands[name]
    return {opt for p in command.params for opt in getattr(p, "opts", [])}


@pytest.mark.parametrize("package", SERVER["packages"], ids=lambda p: p["identifier"])
def test_server_json_describes_the_real_cli(package: dict[str, Any]) -> None:
    args = package["packageArguments"]
    positional = [a["value"] for a in args if a["type"] == "positional"]
    assert positional == ["mcp"]
    named = {a["name"] for a in args if a["type"] == "named"}
    assert named <= _options(("mcp",))
    for env in package["environmentVariables"]:
        field = env["name"].removeprefix("WALKEEP_").lower()
        assert env["name"].startswith("WALKEEP_") and field in Settings.model_fields, env
    for remote in SERVER["remotes"]:
        assert remote["url"].endswith("/mcp")
