"""The local explorer's address page: a wallet's renewals and Blob objects, paged."""

from __future__ import annotations

from tests.test_devnet import EPOCH, OTHER, Devnet, devnet, put  # noqa: F401
from walkeep.backends.localnet import LocalChain
from walkeep.backends.localnet import explorer as explorer_module


def test_address_page_lists_renewals_and_objects_and_pages_them(devnet: Devnet) -> None:  # noqa: F811
    net = devnet.net
    addr = net.server_address
    chain = LocalChain(net, public_url=devnet.url)
    objects = [put(devnet, f"blob {i}".encode(), epochs="5").json() for i in range(3)]
    ids = sorted(o["newlyCreated"]["blobObject"]["id"] for o in objects)
    put(devnet, b"someone else's", epochs="5", send_object_to=OTHER)
    devnet.clock.advance(EPOCH * 2)
    digests = [chain.execute(chain.prepare_extend([(oid, 1)])).digest for oid in ids]

    # The transaction page's sender links to the address page.
    tx_html = devnet.http.get(f"/explorer/tx/{digests[0]}").text
    assert f"href='/explorer/address/{addr}'" in tx_html

    page = devnet.http.get(f"/explorer/address/{addr}")
    assert page.status_code == 200 and "network: local" in page.text
    for d in digests:
        assert f"/explorer/tx/{d}" in page.text
    body = devnet.http.get(f"/explorer/address/{addr}", params={"format": "json"}).json()
    assert body["network"] == "local" and body["address"] == addr
    assert [r["digest"] for r in body["renewals"]] == digests[::-1]  # newest first
    assert all(r["blobs"] == 1 and r["wal_cost_frost"] > 0 for r in body["renewals"])
    assert [o["object_id"] for o in body["objects"]] == ids  # not the other owner's
    assert body["renewals_next"] is None and body["objects_next"] is None

    # Short forms of the address resolve to the same page; the other owner has no renewals.
    other = devnet.http.get(f"/explorer/address/{OTHER}", params={"format": "json"}).json()
    assert other["renewals"] == [] and len(other["objects"]) == 1
    bad = devnet.http.get("/explorer/address/<script>", params={"format": "json"})
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "NOT_FOUND"


def test_address_page_paginates(devnet: Devnet, monkeypatch) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    monkeypatch.setattr(explorer_module, "ADDRESS_PAGE", 2)
    net = devnet.net
    chain = LocalChain(net, public_url=devnet.url)
    ids = sorted(
        put(devnet, f"p {i}".encode(), epochs="5").json()["newlyCreated"]["blobObject"]["id"]
        for i in range(5)
    )
    devnet.clock.advance(EPOCH * 2)
    digests = [chain.execute(chain.prepare_extend([(oid, 1)])).digest for oid in ids]
    url = f"/explorer/address/{net.server_address}"
    seen_tx: list[str] = []
    params: dict[str, str] = {"format": "json"}
    while True:
        body = devnet.http.get(url, params=params).json()
        seen_tx += [r["digest"] for r in body["renewals"]]
        if body["renewals_next"] is None:
            break
        params = {"format": "json", "tx_before": str(body["renewals_next"])}
    assert seen_tx == digests[::-1]
    seen_obj: list[str] = []
    params = {"format": "json"}
    while True:
        body = devnet.http.get(url, params=params).json()
        seen_obj += [o["object_id"] for o in body["objects"]]
        if body["objects_next"] is None:
            break
        params = {"format": "json", "obj_after": body["objects_next"]}
    assert seen_obj == ids
    html = devnet.http.get(url).text
    assert "Older renewals" in html and "More objects" in html
