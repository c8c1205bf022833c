"""Auth discovery: RFC 9728 protected-resource metadata, and 401s a host can act on.

Against real uvicorn on a free port; bearer API keys keep working unchanged.
"""

from __future__ import annotations

import httpx

from tests.test_mcp_e2e import Server, live  # noqa: F401  (fixture)
from walkeep.service.operators import accounts


def test_metadata_served_at_both_well_known_paths(live: Server) -> None:  # noqa: F811
    with httpx.Client(base_url=live.url, timeout=30) as h:
        mcp = h.get("/.well-known/oauth-protected-resource/mcp")
        assert mcp.status_code == 200, mcp.text
        body = mcp.json()
        assert body["resource"] == f"{live.url}/mcp"
        assert body["bearer_methods_supported"] == ["header"]
        assert body["resource_name"] == "Walkeep"
        # API keys come from the operator: no OAuth server is advertised.
        assert "authorization_servers" not in body
        root = h.get("/.well-known/oauth-protected-resource")
        assert root.status_code == 200 and root.json()["resource"].rstrip("/") == live.url
        # Browser-based hosts fetch it cross-origin.
        pre = h.options(
            "/.well-known/oauth-protected-resource/mcp",
            headers={"Origin": "https://example.org", "Access-Control-Request-Method": "GET"},
        )
        assert pre.status_code == 200
        assert pre.headers.get("access-control-allow-origin") == "*"


def test_401_points_at_metadata_and_says_how_to_get_a_key(live: Server) -> None:  # noqa: F811
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    with httpx.Client(base_url=live.url, timeout=30) as h:
        missing = h.post("/mcp", json=rpc)
        assert missing.status_code == 401
        challenge = missing.headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="walkeep"')
        assert "error=" not in challenge  # RFC 6750 §3.1: no error code without credentials
        meta_url = f"{live.url}/.well-known/oauth-protected-resource/mcp"
        assert f'resource_metadata="{meta_url}"' in challenge
        rpc_error = missing.json()["error"]  # a JSON-RPC error: what MCP clients read
        assert missing.json()["jsonrpc"] == "2.0" and rpc_error["code"] == -32001
        body = rpc_error["data"]
        assert rpc_error["message"] == body["message"]
        assert body["code"] == "UNAUTHORIZED"
        assert "no API key" in body["message"]
        assert "walkeep key create" in body["message"] and "walkeep serve" in body["message"]
        assert body["data"]["resource_metadata"] == meta_url
        # The advertised URL really serves the metadata.
        assert h.get(meta_url).json()["resource"] == f"{live.url}/mcp"

        bad = h.post("/mcp", json=rpc, headers={"Authorization": "Bearer wk_live_nope"})
        assert bad.status_code == 401
        assert 'error="invalid_token"' in bad.headers["www-authenticate"]
        assert "not accepted" in bad.json()["error"]["message"]

        rest = h.get("/v1/check_balance", headers={"Authorization": "Bearer wk_live_nope"})
        assert rest.status_code == 401 and "not accepted" in rest.json()["message"]
        root_meta = f'resource_metadata="{live.url}/.well-known/oauth-protected-resource"'
        assert root_meta in rest.headers["www-authenticate"]
        assert "error=" not in h.get("/v1/check_balance").headers["www-authenticate"]

        key = accounts.create_account(live.rt.db, "disc", credits_mc=1000).api_key
        ok = h.get("/v1/check_balance", headers={"Authorization": f"Bearer {key}"})
        assert ok.status_code == 200 and ok.json()["balance_credits"] == 1
