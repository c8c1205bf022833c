"""What a newcomer sees on first run: the saved key and MCP client configs to paste.

Also where ``walkeep mcp`` (local stdio or the ``--url`` bridge) finds its key. Kept
free of database and runtime imports so the bridge stays light.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from walkeep.errors import ConfigurationError

if TYPE_CHECKING:
    from walkeep.config import Settings


def write_credentials(path: Path, api_key: str, account_id: str, mcp_url: str) -> None:
    """Write the key with mode 0600 from the start (never world-readable, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"api_key": api_key, "account_id": account_id, "mcp_url": mcp_url}, indent=2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data.encode() + b"\n")
    finally:
        os.close(fd)
    os.chmod(path, 0o600)


def walkeep_command() -> str:
    """The absolute path of this installation's ``walkeep`` command.

    Why absolute: hosts such as Claude Desktop start commands with a minimal ``PATH``,
    so a bare ``walkeep`` in the pasted config is not found. The script beside this
    interpreter is the one installed with this package (a virtualenv's ``bin``); else
    whatever ``PATH`` finds; else the bare name.
    """
    beside = Path(sys.executable).parent / "walkeep"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("walkeep")
    return str(Path(found).resolve()) if found else "walkeep"


def client_configs(mcp_url: str, api_key: str) -> str:
    http_json = json.dumps(
        {
            "mcpServers": {
                "walkeep": {"url": mcp_url, "headers": {"Authorization": f"Bearer {api_key}"}}
            }
        },
        indent=2,
    )
    stdio_json = json.dumps(
        {
            "mcpServers": {
                "walkeep": {
                    "command": walkeep_command(),
                    "args": ["mcp"],
                    "env": {"WALKEEP_API_KEY": api_key},
                }
            }
        },
        indent=2,
    )
    return (
        "Claude Code:\n"
        f'  claude mcp add --transport http walkeep {mcp_url} --header "Authorization: Bearer {api_key}"\n\n'
        "Cursor (~/.cursor/mcp.json) / any Streamable-HTTP client:\n"
        f"{http_json}\n\n"
        "Claude Desktop or any host that launches a command (stdio):\n"
        f"{stdio_json}\n"
    )


def credentials_path(settings: Settings) -> Path:
    return settings.data_dir / "credentials.json"


def resolve_api_key(settings: Settings, flag: str | None) -> str:
    if flag:
        return flag
    if settings.api_key:
        return settings.api_key
    path = credentials_path(settings)
    if path.exists():
        try:
            return str(json.loads(path.read_text())["api_key"])
        except (ValueError, KeyError) as exc:
            raise ConfigurationError(f"{path} is not a valid credentials file") from exc
    raise ConfigurationError(
        "no API key: pass --api-key, set WALKEEP_API_KEY, or run `walkeep serve` once "
        f"to create {path}"
    )
