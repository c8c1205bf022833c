"""Keys confined to one namespace: the one check every transport's tool call goes through.

An operator may confine an API key to its default namespace (``walkeep key create
--namespace NS --only-namespace``): an agent holding it acts only inside ``NS``. MCP over
HTTP and stdio (``walkeep/mcp/server.py``) and REST (``walkeep/api/rest.py``) each pass
every tool call's arguments through :func:`confine` before the service function runs, so
the rule lives here once and no tool's own code has to know about keys:

- a tool that takes a namespace (``store``, ``recall``, ``export``) is given ``NS`` when
  the call names none, and refused with ``FORBIDDEN`` when it names another;
- a tool that finds memories by id or summarises the account (``forget``,
  ``check_runway``, and ``store`` for its ``supersedes``) is told ``confined_to=NS``:
  ids outside it are ``NOT_FOUND`` as unknown ones are, the summary counts only ``NS``;
- ``check_balance`` and ``top_up`` are account-wide by nature and pass unchanged.

A tool not listed below passes unchanged, so a new tool must be placed in one of the
lists: ``tests/test_confined_keys.py`` fails while one is not.
"""

from __future__ import annotations

from typing import Any

from walkeep.errors import Forbidden
from walkeep.service.namespaces import validate_namespace

# Tools whose ``namespace`` argument says where they act or what they read.
NAMED = frozenset({"store", "recall", "export"})
# Tools that take ``confined_to``: they find memories by id, or count the account.
RESTRICTED = frozenset({"store", "forget", "check_runway"})
# Tools about the account's credits, which a confined key shares with the account.
ACCOUNT_WIDE = frozenset({"check_balance", "top_up"})


def confine(tool: str, kwargs: dict[str, Any], only: str | None) -> dict[str, Any]:
    """The arguments ``tool`` runs with for a key confined to namespace ``only`` (``None``:
    not confined, the arguments as given). Raises ``Forbidden`` for another namespace."""
    if only is None:
        return kwargs
    out = dict(kwargs)
    if tool in NAMED:
        asked = out.get("namespace")
        if asked is None:
            out["namespace"] = only
        elif validate_namespace(asked) != only:
            raise Forbidden(
                f"this API key is confined to namespace {only!r}; it cannot use another",
                {"field": "namespace", "namespace": only},
            )
    if tool in RESTRICTED:
        out["confined_to"] = only
    return out
