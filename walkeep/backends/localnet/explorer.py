"""A small explorer for the local network, so the audit flow works on one machine.

On testnet/mainnet a renewal digest is pasted into Suiscan; on the local
network Walkeep links here instead (``LocalChain.explorer_tx_url``). Pages
show what an auditor checks on a real explorer (notes §5): sender, status,
each ``<package>::system::extend_blob`` call with the Blob object, ``k`` and
old → new end_epoch, the Walrus epoch, the time and the WAL paid — under a
loud "network: local" banner, because a local digest proves nothing about a
public chain.

HTML by default; JSON with ``?format=json`` or ``Accept: application/json``.
Every value placed in HTML is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from walkeep.backends.localnet.codec import BLOB_TYPE, blob_id_to_u256, normalize_address
from walkeep.backends.localnet.engine import LocalNetwork
from walkeep.backends.localnet.records import NETWORK, AddressTx, ObjectRecord, TxRecord

FROST_PER_WAL = 1_000_000_000


def wants_json(request: Request) -> bool:
    """``?format=json``, or an Accept header asking for JSON rather than HTML."""
    fmt = request.query_params.get("format")
    if fmt is not None:
        return fmt.lower() == "json"
    accept = request.headers.get("accept", "").lower()
    return "application/json" in accept and "text/html" not in accept


def _wal(frost: int) -> str:
    whole, frac = divmod(frost, FROST_PER_WAL)
    return f"{whole}.{frac:09d}".rstrip("0").rstrip(".") + " WAL"


def quilt_sizes(net: LocalNetwork, rec: TxRecord) -> dict[str, int]:
    """Patch counts of the quilts a transaction extends (a quilt renews as one blob)."""
    out: dict[str, int] = {}
    for call in rec.calls:
        blob_id = call.get("blob_id")
        if blob_id and call["function"].endswith("::system::extend_blob"):
            n = net.quilt_patch_count(blob_id)
            if n:
                out[blob_id] = n
    return out


def tx_json(rec: TxRecord, quilts: dict[str, int] | None = None) -> dict[str, Any]:
    quilts = quilts or {}
    return {
        "network": NETWORK,
        "digest": rec.digest,
        "kind": rec.kind,
        "status": rec.status,
        "sender": rec.sender,
        "epoch": rec.epoch,
        "timestamp": rec.timestamp.isoformat(),
        "checkpoint": rec.checkpoint,
        "package_id": rec.package_id,
        "calls": [
            {**c, "quilt_patches": quilts[c["blob_id"]]} if c.get("blob_id") in quilts else dict(c)
            for c in rec.calls
        ],
        "wal_cost_frost": rec.wal_cost_frost,
        "storage_price_frost": rec.price_frost,
        "gas_used": rec.gas_used,
        "tx_bytes": rec.tx_bytes,
    }


def object_json(net: LocalNetwork, rec: ObjectRecord, current_epoch: int) -> dict[str, Any]:
    # A quilt is an ordinary Blob on chain; say so, since one renewal covers all its patches.
    patches = net.quilt_patch_count(rec.blob_id)
    return {
        "network": NETWORK,
        "object_id": rec.object_id,
        "type": BLOB_TYPE,
        "kind": "quilt" if patches else "blob",
        "quilt_patches": patches,
        "blob_id": rec.blob_id,
        "blob_id_u256": str(blob_id_to_u256(rec.blob_id)),
        "owner": rec.owner,
        "size": rec.size,
        "storage_size": rec.storage_size,
        "storage_id": rec.storage_id,
        "registered_epoch": rec.registered_epoch,
        "certified_epoch": rec.certified_epoch,
        "start_epoch": rec.start_epoch,
        "end_epoch": rec.end_epoch,
        "deletable": rec.deletable,
        "version": rec.version,
        "current_epoch": current_epoch,
        "status": "live" if current_epoch < rec.end_epoch else "lapsed",
        "created_tx": rec.created_tx,
        "extensions": [
            {
                "digest": e.digest,
                "epoch": e.epoch,
                "timestamp": e.timestamp.isoformat(),
                "epochs": e.epochs,
                "old_end_epoch": e.old_end_epoch,
                "new_end_epoch": e.new_end_epoch,
            }
            for e in net.object_extensions(rec.object_id)
        ],
    }


# --- HTML ----------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
.banner{background:#b00020;color:#fff;padding:.7em 1.2em;font-weight:700;letter-spacing:.03em}
main{max-width:72em;margin:1.5em auto;padding:0 1.2em}
table{border-collapse:collapse;width:100%;background:#fff;margin:.6em 0 1.4em}
th,td{text-align:left;padding:.45em .7em;border-bottom:1px solid #e3e6eb;vertical-align:top}
th{width:14em;color:#555;font-weight:600}
code{font-family:ui-monospace,monospace;font-size:.92em;word-break:break-all}
.ok{color:#0a7d32;font-weight:700}.bad{color:#b00020;font-weight:700}
h1{font-size:1.3em;overflow-wrap:anywhere}h2{font-size:1.05em;margin-top:1.4em}
table.list th{width:auto}
table.list{display:block;overflow-x:auto}
.nowrap{white-space:nowrap}
table.stack th{width:auto}
@media (max-width:40em){th{width:7em}main{padding:0 .6em}
table.stack thead{display:none}
table.stack,table.stack tbody,table.stack tr,table.stack td{display:block;width:100%}
table.stack tr{border-bottom:2px solid #e3e6eb;padding:.3em 0}
table.stack td{border:0;padding:.15em .7em;display:flex;gap:.6em;box-sizing:border-box}
table.stack td::before{content:attr(data-label);flex:0 0 6.5em;color:#555;font-weight:600}
table.stack td>*{min-width:0}}
.pager{margin:-.8em 0 1.4em}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _patches(n: int) -> str:
    """'1 patch', '3 patches' (not "quilt of 1 patches")."""
    return f"{_e(n)} patch" if n == 1 else f"{_e(n)} patches"


def _page(title: str, body: str, status_code: int = 200) -> HTMLResponse:
    doc = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        # Without it a phone lays the page out 980 px wide and shrinks it (issue 30).
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{_e(title)} — local explorer</title><style>{_CSS}</style></head><body>"
        "<div class='banner'>network: local — a simulated Walrus + Sui on this machine; "
        "these digests and objects do not exist on any public chain</div>"
        f"<main>{body}</main></body></html>"
    )
    return HTMLResponse(doc, status_code=status_code)


def _rows(pairs: list[tuple[str, str]]) -> str:
    """Table rows; values are already-escaped HTML fragments."""
    return "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in pairs)


def _obj_link(oid: str) -> str:
    return f"<a href='/explorer/object/{_e(oid)}'><code>{_e(oid)}</code></a>"


def _addr_link(address: str) -> str:
    return f"<a href='/explorer/address/{_e(address)}'><code>{_e(address)}</code></a>"


def _tx_link(digest: str) -> str:
    return f"<a href='/explorer/tx/{_e(digest)}'><code>{_e(digest)}</code></a>"


def tx_html(rec: TxRecord, quilts: dict[str, int] | None = None) -> HTMLResponse:
    quilts = quilts or {}
    status_cls = "ok" if rec.status == "success" else "bad"
    head = _rows(
        [
            ("Network", "<strong>local</strong>"),
            ("Digest", f"<code>{_e(rec.digest)}</code>"),
            ("Status", f"<span class='{status_cls}'>{_e(rec.status)}</span>"),
            ("Kind", _e(rec.kind)),
            ("Sender", _addr_link(rec.sender)),
            ("Walrus epoch", _e(rec.epoch)),
            ("Time", _e(rec.timestamp.isoformat())),
            ("Checkpoint", _e(rec.checkpoint)),
            ("WAL cost", f"{_e(_wal(rec.wal_cost_frost))} ({_e(rec.wal_cost_frost)} FROST)"),
            ("Storage price", f"{_e(rec.price_frost)} FROST per MiB per epoch"),
            ("Gas used", f"{_e(rec.gas_used)} MIST"),
        ]
    )
    calls = []
    for i, call in enumerate(rec.calls):
        fields: list[tuple[str, str]] = [("Function", f"<code>{_e(call['function'])}</code>")]
        if call["function"].endswith("::system::extend_blob"):
            fields += [
                ("Blob object", _obj_link(call["blob_object_id"])),
                ("Blob id", f"<code>{_e(call['blob_id'])}</code>"),
                (
                    "Kind",
                    f"quilt of {_patches(quilts[call['blob_id']])}: one renewal for all of them"
                    if call["blob_id"] in quilts
                    else "blob",
                ),
                ("Epochs added (k)", _e(call["epochs"])),
                (
                    "End epoch",
                    f"{_e(call['old_end_epoch'])} → <strong>{_e(call['new_end_epoch'])}</strong>",
                ),
            ]
        else:
            for key, value in call.items():
                if key == "function":
                    continue
                shown = _obj_link(value) if key == "blob_object_id" else f"<code>{_e(value)}</code>"
                fields.append((key.replace("_", " ").capitalize(), shown))
        calls.append(f"<h2>Call {i}</h2><table>{_rows(fields)}</table>")
    body = (
        f"<h1>Transaction <code>{_e(rec.digest)}</code></h1><table>{head}</table>"
        + "".join(calls)
        + f"<h2>Transaction bytes (base64)</h2><p><code>{_e(rec.tx_bytes)}</code></p>"
    )
    return _page(f"tx {rec.digest}", body)


def object_html(data: dict[str, Any]) -> HTMLResponse:
    live = data["status"] == "live"
    head = _rows(
        [
            ("Network", "<strong>local</strong>"),
            ("Object id", f"<code>{_e(data['object_id'])}</code>"),
            ("Type", f"<code>{_e(data['type'])}</code>"),
            (
                "Kind",
                f"quilt of {_patches(data['quilt_patches'])} (stored and renewed as one blob)"
                if data["kind"] == "quilt"
                else "blob",
            ),
            ("Blob id", f"<code>{_e(data['blob_id'])}</code>"),
            ("Blob id (u256)", f"<code>{_e(data['blob_id_u256'])}</code>"),
            ("Owner", _addr_link(data["owner"])),
            ("Size", f"{_e(data['size'])} bytes"),
            ("Storage size", f"{_e(data['storage_size'])} encoded bytes"),
            ("Registered epoch", _e(data["registered_epoch"])),
            ("End epoch (exclusive)", _e(data["end_epoch"])),
            ("Current epoch", _e(data["current_epoch"])),
            (
                "Status",
                f"<span class='{'ok' if live else 'bad'}'>{'live' if live else 'lapsed'}</span>",
            ),
            ("Deletable", _e(data["deletable"])),
            ("Version", _e(data["version"])),
            ("Created by", _tx_link(data["created_tx"])),
        ]
    )
    if data["extensions"]:
        # A table on a desktop, labelled rows on a phone (class "stack"): five columns
        # with a digest and a timestamp made the page 507 px wide at 390.
        rows = "".join(
            f"<tr><td data-label='Transaction'>{_tx_link(e['digest'])}</td>"
            f"<td data-label='Epoch'>{_e(e['epoch'])}</td>"
            f"<td data-label='Time'><span>{_e(e['timestamp'])}</span></td>"
            f"<td data-label='k'>{_e(e['epochs'])}</td>"
            f"<td data-label='End epoch'>{_e(e['old_end_epoch'])} → "
            f"{_e(e['new_end_epoch'])}</td></tr>"
            for e in data["extensions"]
        )
        ext = (
            "<table class='stack'><thead><tr><th>Transaction</th><th>Epoch</th><th>Time</th>"
            f"<th>k</th><th>End epoch</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    else:
        ext = "<p>Never extended.</p>"
    body = (
        f"<h1>Blob object <code>{_e(data['object_id'])}</code></h1><table>{head}</table>"
        f"<h2>Extensions</h2>{ext}"
    )
    return _page(f"object {data['object_id']}", body)


ADDRESS_PAGE = 20


def address_json(
    address: str,
    current_epoch: int,
    txs: list[AddressTx],
    objects: list[ObjectRecord],
    *,
    next_tx: int | None,
    next_obj: str | None,
) -> dict[str, Any]:
    return {
        "network": NETWORK,
        "address": address,
        "current_epoch": current_epoch,
        "renewals": [
            {
                "digest": t.digest,
                "status": t.status,
                "epoch": t.epoch,
                "timestamp": t.timestamp.isoformat(),
                "blobs": t.blobs,
                "wal_cost_frost": t.wal_cost_frost,
            }
            for t in txs
        ],
        "renewals_next": next_tx,
        "objects": [
            {
                "object_id": o.object_id,
                "blob_id": o.blob_id,
                "size": o.size,
                "end_epoch": o.end_epoch,
                "status": "live" if current_epoch < o.end_epoch else "lapsed",
            }
            for o in objects
        ],
        "objects_next": next_obj,
    }


def address_html(data: dict[str, Any], here: str) -> HTMLResponse:
    """The wallet's renewal transactions and Blob objects, each list paged on its own."""
    addr = data["address"]
    if data["renewals"]:
        rows = "".join(
            f"<tr><td>{_tx_link(t['digest'])}</td><td>{_e(t['status'])}</td>"
            f"<td>{_e(t['epoch'])}</td><td>{_e(t['timestamp'])}</td><td>{_e(t['blobs'])}</td>"
            f"<td>{_e(_wal(t['wal_cost_frost']))}</td></tr>"
            for t in data["renewals"]
        )
        txs = (
            "<table class='list'><tr><th>Transaction</th><th>Status</th><th>Epoch</th>"
            f"<th>Time</th><th>Blobs</th><th>WAL</th></tr>{rows}</table>"
        )
    else:
        txs = "<p>No renewal transactions from this address.</p>"
    if data["renewals_next"] is not None:
        txs += (
            f"<p class='pager'><a href='{_e(here)}?tx_before={_e(data['renewals_next'])}'>"
            "Older renewals →</a></p>"
        )
    if data["objects"]:
        rows = "".join(
            f"<tr><td>{_obj_link(o['object_id'])}</td><td><code>{_e(o['blob_id'])}</code></td>"
            f"<td class='nowrap'>{_e(o['size'])} B</td><td>{_e(o['end_epoch'])}</td>"
            f"<td class='{'ok' if o['status'] == 'live' else 'bad'}'>{_e(o['status'])}</td></tr>"
            for o in data["objects"]
        )
        objs = (
            "<table class='list'><tr><th>Blob object</th><th>Blob id</th><th>Size</th>"
            f"<th>End epoch</th><th>Status</th></tr>{rows}</table>"
        )
    else:
        objs = "<p>This address owns no Blob objects.</p>"
    if data["objects_next"] is not None:
        objs += (
            f"<p class='pager'><a href='{_e(here)}?obj_after={_e(data['objects_next'])}'>"
            "More objects →</a></p>"
        )
    head = _rows(
        [
            ("Network", "<strong>local</strong>"),
            ("Address", f"<code>{_e(addr)}</code>"),
            ("Current epoch", _e(data["current_epoch"])),
        ]
    )
    body = (
        f"<h1>Address <code>{_e(addr)}</code></h1><table>{head}</table>"
        f"<h2>Renewal transactions (newest first)</h2>{txs}<h2>Blob objects</h2>{objs}"
    )
    return _page(f"address {addr}", body)


def _not_found(request: Request, what: str, ident: str) -> Response:
    message = f"no {what} {ident} on the local network"
    if wants_json(request):
        return JSONResponse(
            {"network": NETWORK, "error": {"code": "NOT_FOUND", "message": message}},
            status_code=404,
        )
    return _page("not found", f"<h1>Not found</h1><p>{_e(message)}</p>", status_code=404)


def make_explorer_router(get_network: Callable[[], LocalNetwork]) -> APIRouter:
    """Routes ``GET /explorer/tx/{digest}``, ``/explorer/object/{object_id}`` and
    ``/explorer/address/{address}``.

    ``get_network`` is called per request, so the main app can mount this
    before its runtime (and its LocalNetwork) exists.
    """
    router = APIRouter()

    @router.get("/explorer/tx/{digest}", response_model=None)
    def explorer_tx(digest: str, request: Request) -> Response:
        net = get_network()
        rec = net.transaction_record(digest)
        if rec is None:
            return _not_found(request, "transaction", digest)
        quilts = quilt_sizes(net, rec)
        if wants_json(request):
            return JSONResponse(tx_json(rec, quilts))
        return tx_html(rec, quilts)

    @router.get("/explorer/object/{object_id}", response_model=None)
    def explorer_object(object_id: str, request: Request) -> Response:
        net = get_network()
        rec = net.object_record(object_id)
        if rec is None:
            return _not_found(request, "object", object_id)
        data = object_json(net, rec, net.peek_epoch())
        if wants_json(request):
            return JSONResponse(data)
        return object_html(data)

    @router.get("/explorer/address/{address}", response_model=None)
    def explorer_address(address: str, request: Request) -> Response:
        net = get_network()
        try:
            addr = normalize_address(address)
        except ValueError:
            return _not_found(request, "address", address)
        q = request.query_params
        try:
            before = int(q["tx_before"]) if "tx_before" in q else None
        except ValueError:
            before = None
        after = q.get("obj_after", "")
        txs = net.address_renewals(addr, limit=ADDRESS_PAGE + 1, before_seq=before)
        objs = net.address_objects(addr, limit=ADDRESS_PAGE + 1, after=after)
        data = address_json(
            addr,
            net.peek_epoch(),
            txs[:ADDRESS_PAGE],
            objs[:ADDRESS_PAGE],
            next_tx=txs[ADDRESS_PAGE - 1].seq if len(txs) > ADDRESS_PAGE else None,
            next_obj=objs[ADDRESS_PAGE - 1].object_id if len(objs) > ADDRESS_PAGE else None,
        )
        if wants_json(request):
            return JSONResponse(data)
        return address_html(data, f"/explorer/address/{addr}")

    return router
