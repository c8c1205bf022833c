"""Recall quality on LoCoMo: does ``recall`` find the turns a question is about?

    python bench/recall_quality.py [--data PATH] [--split dev|test|all]
                                   [--format dated|plain] [--rankings hybrid,dense,lexical]
                                   [--in-process] [--keep DIR] [--limit-conversations N]
                                   [--concurrency 4] [--interleave]

    # the figures of record: the test split, every ranking, through the server
    python bench/recall_quality.py --data ~/datasets/locomo10.json
    # tuning: the dev split, in process, stores kept for the next run
    python bench/recall_quality.py --data … --split dev --in-process --keep /tmp/lq-dev

What it measures (issue 27): every dialog turn of the LoCoMo conversations is stored
as ONE memory, each conversation in its own namespace (``locomo-<id>``); every
question is then asked with ``recall`` (that namespace, limit 10), and the
dataset's evidence turns are the ground truth. No LLM anywhere. Per ranking:

- recall@1, @5, @10: the fraction of a question's evidence turns in the top k,
  averaged over questions;
- hit@5: the fraction of questions with any evidence turn in the top 5;
- MRR: 1 / rank of the first evidence turn (0 if none is in the top 10);
- p50 / p95 latency of one recall, in ms, measured by the client.

A hit is mapped back to its turn by its content (recall returns content verbatim);
turns with identical content map to all their dialog ids.

By default it goes through the real recall path, as a user would: it starts
``walkeep serve`` on a free port with a fresh data directory (a temporary one unless
``--keep DIR``), reads the first-run API key from ``<data dir>/credentials.json``,
stores every turn with the official MCP client (a few calls in flight, one
request_id per turn), waits until ``check_runway`` shows every memory active, then
restarts the server on the same data once per ranking with
``WALKEEP_RECALL_RANKING=<ranking>`` and asks every question through MCP ``recall``.
Rankings: ``hybrid`` (lexical + dense, fused), ``dense``, ``lexical``; a server that
does not know the setting ranks them all alike (the script says so when every
ranking returned the same lists). Credits: the first-run account gets enough promo
credits (``WALKEEP_PROMO_CREDITS_USD``); a reused ``--keep`` directory short of
credits is topped up with ``walkeep credits grant``. Rate limits are off for the
benchmark (``WALKEEP_RATE_LIMIT_PER_MINUTE=0``, ``WALKEEP_RATE_LIMITS={}``). Other
``WALKEEP_*`` variables in your environment reach the server (e.g. tuning knobs);
the data directory, database, key, public URL and ranking are the script's own.

``--interleave`` (server mode) starts the three servers at once instead, each on its
own copy of the landed data directory, and asks each question of each in turn: on a
shared machine whose speed drifts by a third within minutes, the latencies of rankings
asked minutes apart differ by that much for identical code (p50 21 vs 32 ms here),
while interleaved ones stay within a few percent. Use it to compare latencies; the
quality figures are the same either way.

``--in-process`` measures the same data with the same metrics without HTTP: it builds
a Runtime (walkeep.bootstrap.build_runtime) on a SQLite file, stores through
``walkeep.service.tools.store``, drives completion until every memory has landed, and calls
``walkeep.service.tools.recall.recall`` once per question, with a fresh Runtime per ranking
(the ranking set on its Settings, field ``recall_ranking``, and in the environment as
``WALKEEP_RECALL_RANKING``). Quicker for iterating on the ranking; the numbers of
record are the server's.

``--keep DIR`` keeps the data directory, and a rerun on it stores nothing new: the
request ids are stable (``locomo-<id>-<dialog id>-<format>``), so each store replays,
and only the questions are asked again (a directory holds one format and one mode).
Costs on a shared 2-core machine, all ten conversations (5,882 turns, 1,536
questions): about 4.5 min through the server (stores accepted in ~20 s, landed and
embedded in ~80 s, ~45 s of questions per ranking), 3.5 min in process (landing
~2 min); with a kept directory, only the questions. The dense ranking before the
hybrid one (a44fb15), dated turns, split all: recall@5 0.423, MRR 0.341 (plain turns:
0.208, 0.156); the first hybrid (b2d6ca8): hybrid 0.589 / 0.501, dense 0.422 / 0.340,
lexical 0.558 / 0.481.

``--split``: conversations sorted by id; ``dev`` is the first half, ``test`` (the
default) the second, ``all`` both. Tune on dev, report test.

Output: a table, and one line per ranking for machines:

    RECALL_QUALITY ranking=<r> split=<s> format=<f> questions=<n> recall_at_1=<…>
    recall_at_5=<…> recall_at_10=<…> hit_at_5=<…> mrr=<…> p50_ms=<…> p95_ms=<…>

(on one line). Progress goes to stderr.

Data: LoCoMo — Maharana et al., "Evaluating Very Long-Term Conversational Memory of
LLM Agents", ACL 2024, https://github.com/snap-research/locomo — ten very long
conversations with question/answer pairs annotated with evidence dialog ids.
Licence: CC BY-NC 4.0, NON-COMMERCIAL. Nothing of it is in this repository or the
wheel: pass ``--data`` (a directory of ``locomo10_v2/<id>.json`` files or holding
``locomo10.json``, a ``.zip`` of either, or ``locomo10.json`` itself), or the script
downloads ``data/locomo10.json`` from that repository into
``~/.cache/walkeep-bench/locomo/`` (``$XDG_CACHE_HOME`` honoured). Both shapes are
read: the per-conversation files (``speaker_a``, ``session_N``,
``session_N_date_time``, ``qa`` at the top level) and upstream's list of samples
(``sample_id``, ``conversation: {…}``, ``qa``). Category 5 questions (adversarial,
no answer in the conversation) are skipped; evidence ids that name no turn are
dropped (after splitting lists such as ``"D8:6; D9:17"`` and reading ``D:11:26`` and
``D30:05`` as ``D11:26`` and ``D30:5``), and a question left without evidence is
skipped; the counts are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASET = "LoCoMo (Maharana et al., ACL 2024, snap-research/locomo), locomo10"
LICENCE = "CC BY-NC 4.0 (non-commercial; not redistributed with Walkeep)"
DOWNLOAD_URLS = (
    "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json",
    "https://github.com/snap-research/locomo/raw/main/data/locomo10.zip",
)
RANKINGS = ("hybrid", "dense", "lexical")
RANKING_ENV = "WALKEEP_RECALL_RANKING"
LIMIT = 10
ADVERSARIAL = 5
# Credits the first-run account starts with: far more than LoCoMo's ~6,000 stores.
PROMO_USD = "1000"
# Variables this script sets for the server itself; the caller's are not passed on.
OWN_ENV = {
    "WALKEEP_DATA_DIR",
    "WALKEEP_DATABASE_URL",
    "WALKEEP_API_KEY",
    "WALKEEP_PUBLIC_URL",
    "WALKEEP_NAMESPACE",
    RANKING_ENV,
}
MANIFEST = "recall-quality.json"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the dataset ------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    date: str
    caption: str | None

    def content(self, fmt: str) -> str:
        if fmt == "plain":
            return self.text
        shared = f" [shares a photo: {self.caption}]" if self.caption else ""
        return f'({self.date}) {self.speaker} said, "{self.text}"{shared}'


@dataclass(frozen=True)
class Question:
    text: str
    evidence: frozenset[str]
    category: int


@dataclass
class Conversation:
    conv_id: str
    turns: list[Turn]
    questions: list[Question]
    adversarial: int = 0
    no_evidence: int = 0
    dropped_ids: int = 0

    @property
    def namespace(self) -> str:
        return f"locomo-{self.conv_id}"


def natural_key(s: str) -> list[Any]:
    """ "conv-9" before "conv-26"; numbers compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def session_date(raw: object) -> str:
    """ "1:56 pm on 8 May, 2023" → "8 May 2023" (anything else: as given)."""
    text = str(raw or "").strip()
    m = re.search(r"(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", text)
    return f"{int(m.group(1))} {m.group(2)} {m.group(3)}" if m else text


def evidence_ids(raw: Iterable[object]) -> list[str]:
    """The dialog ids an evidence list names, in the D<session>:<turn> form of the turns."""
    out = []
    for item in raw:
        for part in re.split(r"[;,\s]+", str(item)):
            m = re.fullmatch(r"D:?(\d+):(\d+)", part.strip())
            out.append(f"D{int(m.group(1))}:{int(m.group(2))}" if m else part)
    return [e for e in out if e]


def parse_conversation(sample: dict[str, Any], fallback_id: str) -> Conversation:
    conv = sample.get("conversation", sample)
    raw_id = str(sample.get("sample_id") or fallback_id)
    m = re.fullmatch(r"conv-(\d+)", raw_id)
    conv_id = m.group(1) if m else raw_id
    turns: list[Turn] = []
    sessions = sorted(
        (int(m.group(1)), v)
        for k, v in conv.items()
        if (m := re.fullmatch(r"session_(\d+)", k)) and isinstance(v, list)
    )
    for n, session in sessions:
        date = session_date(conv.get(f"session_{n}_date_time"))
        for t in session:
            text = str(t.get("text", "")).strip()
            if not text:
                continue
            caption = t.get("blip_caption")
            turns.append(
                Turn(
                    dia_id=str(t["dia_id"]),
                    speaker=str(t.get("speaker", "")),
                    text=text,
                    date=date,
                    caption=str(caption).strip() if caption else None,
                )
            )
    known = {t.dia_id for t in turns}
    out = Conversation(conv_id=conv_id, turns=turns, questions=[])
    for qa in sample.get("qa", []):
        if int(qa.get("category", 0)) == ADVERSARIAL:
            out.adversarial += 1
            continue
        ids = evidence_ids(qa.get("evidence", []))
        valid = frozenset(e for e in ids if e in known)
        out.dropped_ids += sum(1 for e in ids if e not in known)
        if not valid:
            out.no_evidence += 1
            continue
        out.questions.append(Question(str(qa["question"]), valid, int(qa.get("category", 0))))
    return out


def parse_json(raw: bytes, name: str) -> list[Conversation]:
    """One file: upstream's list of samples, or one conversation (its id: the file name)."""
    data = json.loads(raw)
    if isinstance(data, list):
        return [parse_conversation(s, f"{name}-{i}") for i, s in enumerate(data)]
    if isinstance(data, dict) and ("qa" in data or "conversation" in data):
        return [parse_conversation(data, Path(name).stem)]
    return []


def read_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every .json file a directory, zip or file holds."""
    if path.is_dir():
        for f in sorted(path.rglob("*.json")):
            if not f.name.startswith("._"):
                yield str(f), f.read_bytes()
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for name in sorted(z.namelist()):
                base = name.rsplit("/", 1)[-1]
                if name.endswith(".json") and not base.startswith("._"):
                    yield name, z.read(name)
    else:
        yield str(path), path.read_bytes()


def load_conversations(path: Path) -> list[Conversation]:
    by_id: dict[str, Conversation] = {}
    for name, raw in read_files(path):
        try:
            found = parse_json(raw, name)
        except (ValueError, KeyError, TypeError) as exc:
            say(f"skipping {name}: not a LoCoMo file ({type(exc).__name__}: {exc})")
            continue
        for conv in found:
            if conv.conv_id in by_id:
                say(
                    f"conversation {conv.conv_id} appears twice; keeping the first ({name} skipped)"
                )
                continue
            by_id[conv.conv_id] = conv
    if not by_id:
        raise SystemExit(f"no LoCoMo conversations found in {path}")
    return [by_id[k] for k in sorted(by_id, key=natural_key)]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "walkeep-bench" / "locomo"


def fetch_dataset() -> Path:
    """The cached download, or a new one; a clear way out when there is no network."""
    import httpx

    target = cache_dir()
    for url in DOWNLOAD_URLS:
        cached = target / url.rsplit("/", 1)[-1]
        if cached.exists():
            return cached
    errors = []
    for url in DOWNLOAD_URLS:
        cached = target / url.rsplit("/", 1)[-1]
        say(f"downloading {url} …")
        try:
            r = httpx.get(url, follow_redirects=True, timeout=60)
            r.raise_for_status()
            if r.content.lstrip()[:1] != b"[" and not zipfile.is_zipfile(io.BytesIO(r.content)):
                raise ValueError("neither JSON nor a zip")
        except (httpx.HTTPError, ValueError) as exc:
            errors.append(f"{url}: {type(exc).__name__}: {exc}")
            continue
        target.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(cached.suffix + ".part")
        part.write_bytes(r.content)
        part.replace(cached)
        say(f"saved {cached} ({len(r.content):,} bytes; {LICENCE})")
        return cached
    raise SystemExit(
        "could not download the LoCoMo dataset:\n  "
        + "\n  ".join(errors)
        + "\nGet it from https://github.com/snap-research/locomo (data/locomo10.json; "
        f"licence {LICENCE}) and pass --data PATH (the .json, a .zip, or a directory), "
        f"or put it in {target}/."
    )


def split(convs: list[Conversation], which: str) -> list[Conversation]:
    half = len(convs) // 2
    return {"dev": convs[:half], "test": convs[half:], "all": convs}[which]


# --- scoring ------------------------------------------------------------------------------


@dataclass
class Scored:
    """One ranking's per-question figures."""

    r1: list[float] = field(default_factory=list)
    r5: list[float] = field(default_factory=list)
    r10: list[float] = field(default_factory=list)
    hit5: list[float] = field(default_factory=list)
    rr: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    category: list[int] = field(default_factory=list)
    unknown_hits: int = 0
    lists: list[tuple[str, ...]] = field(default_factory=list)
    seconds: float = 0.0

    def add(
        self,
        q: Question,
        contents: Sequence[str],
        turn_ids: dict[str, set[str]],
        latency_ms: float,
    ) -> None:
        ranked: list[set[str]] = []
        for c in contents[:LIMIT]:
            ids = turn_ids.get(c)
            if ids is None:
                self.unknown_hits += 1
                ids = set()
            ranked.append(ids & q.evidence)

        def found(k: int) -> float:
            got: set[str] = set().union(*ranked[:k]) if ranked[:k] else set()
            return len(got) / len(q.evidence)

        first = next((i for i, ids in enumerate(ranked) if ids), None)
        self.r1.append(found(1))
        self.r5.append(found(5))
        self.r10.append(found(10))
        self.hit5.append(1.0 if first is not None and first < 5 else 0.0)
        self.rr.append(1.0 / (first + 1) if first is not None else 0.0)
        self.latency_ms.append(latency_ms)
        self.category.append(q.category)
        self.lists.append(tuple(contents[:LIMIT]))

    def figures(self) -> dict[str, float]:
        return {
            "recall_at_1": mean(self.r1),
            "recall_at_5": mean(self.r5),
            "recall_at_10": mean(self.r10),
            "hit_at_5": mean(self.hit5),
            "mrr": mean(self.rr),
            "p50_ms": percentile(self.latency_ms, 50),
            "p95_ms": percentile(self.latency_ms, 95),
        }

    def by_category(self) -> dict[int, tuple[int, float]]:
        """Per category: (questions, recall@5)."""
        groups: dict[int, list[float]] = defaultdict(list)
        for c, v in zip(self.category, self.r5, strict=True):
            groups[c].append(v)
        return {c: (len(v), mean(v)) for c, v in sorted(groups.items())}


def mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    pos = (len(s) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def turn_index(conv: Conversation, fmt: str) -> dict[str, set[str]]:
    """content → every dialog id stored with that content (duplicates map to all)."""
    out: dict[str, set[str]] = defaultdict(set)
    for t in conv.turns:
        out[t.content(fmt)].add(t.dia_id)
    return dict(out)


def request_id(conv: Conversation, turn: Turn, fmt: str) -> str:
    """Stable, so a rerun on a kept data directory replays instead of storing twice."""
    return f"locomo-{conv.conv_id}-{turn.dia_id.replace(':', '-')}-{fmt}"


# --- through `walkeep serve` and the MCP client ---------------------------------------------


class ToolError(Exception):
    def __init__(self, tool: str, code: str, message: str) -> None:
        super().__init__(f"{tool}: {code}: {message}")
        self.code = code


RETRYABLE = {"RELAYER_UNAVAILABLE", "RATE_LIMITED", "SERVICE_UNAVAILABLE"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(data_dir: Path, ranking: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in OWN_ENV and not k.startswith("STRIPE_")  # payments stay local test mode
    }
    env |= {
        "WALKEEP_DATA_DIR": str(data_dir),
        "WALKEEP_PROMO_CREDITS_USD": PROMO_USD,
        "WALKEEP_MAX_STORES_PER_DAY": "10000000",
        # One account asks ~2,000 questions in a few minutes: far past an agent's pace.
        # The per-tool table (recall: 120/min by default) is cleared as well.
        "WALKEEP_RATE_LIMIT_PER_MINUTE": "0",
        "WALKEEP_RATE_LIMITS": "{}",
    }
    if ranking is not None:
        env[RANKING_ENV] = ranking
    return env


class Server:
    """``walkeep serve`` in a session of its own, its log in a file next to the data."""

    def __init__(self, data_dir: Path, log: Path, ranking: str | None) -> None:
        import httpx

        self.data_dir = data_dir
        self.port = free_port()
        self.log = log
        with log.open("a") as err:
            err.write(f"\n--- walkeep serve, ranking={ranking}, port {self.port}\n")
            err.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "walkeep.cli", "serve", "--port", str(self.port)],
                env=server_env(data_dir, ranking),
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                # Not the caller's directory: `python -m` puts it first on sys.path, so a
                # checkout there would be served instead of the walkeep this script
                # imports (the one the report names).
                cwd=data_dir,
            )
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(
                    f"walkeep serve exited with {self.proc.returncode} during start-up; "
                    f"its log ({log}) ends:\n{tail(log)}"
                )
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(
                    f"walkeep serve did not answer /healthz; its log ({log}) ends:\n{tail(log)}"
                )
            time.sleep(0.2)
        # The first run's key, as `walkeep mcp` finds it (walkeep/onboarding.py). Its
        # mcp_url names the first run's port: this run's port is ours.
        creds = json.loads((data_dir / "credentials.json").read_text())
        self.api_key = str(creds["api_key"])

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def mcp_url(self) -> str:
        return f"{self.base}/mcp"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@contextlib.asynccontextmanager
async def mcp_session(url: str, key: str) -> AsyncIterator[Callable[..., Any]]:
    """An official MCP client; yields ``call(tool, **arguments) -> structured result``."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with (
        httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(120)
        ) as http,
        Client(streamable_http_client(url, http_client=http)) as client,  # type: ignore[arg-type]
    ):

        async def call(tool: str, **arguments: Any) -> dict[str, Any]:
            r = await client.call_tool(tool, arguments)
            body = dict(r.structured_content or {})
            if r.is_error:
                raise ToolError(tool, str(body.get("code")), str(body.get("message", body)))
            return body

        yield call


async def call_retrying(call: Callable[..., Any], tool: str, **arguments: Any) -> dict[str, Any]:
    """Retry what the tool contract says to retry (same arguments, same request_id)."""
    import anyio

    for attempt in range(60):
        try:
            result: dict[str, Any] = await call(tool, **arguments)
            return result
        except ToolError as exc:
            if exc.code not in RETRYABLE or attempt == 59:
                raise
            await anyio.sleep(min(0.25 * 2**attempt, 5.0))
    raise AssertionError("unreachable")


def grant_if_short(srv: Server, balance: dict[str, Any], needed: int) -> None:
    """A kept data directory may have spent its credits: grant more, as an operator would."""
    have = int(balance.get("est_memories_remaining", 0))
    if have >= needed:
        return
    usd = max(10, needed // 50 + 10)  # a memory of a few hundred bytes costs 1 credit (1 cent)
    say(f"balance covers {have:,} stores, {needed:,} needed: granting ${usd}")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "walkeep.cli",
            "credits",
            "grant",
            "--account",
            "default",
            "--usd",
            str(usd),
            "--reason",
            "recall quality benchmark",
        ],
        env=server_env(srv.data_dir, None),
        check=True,
        stdout=subprocess.DEVNULL,
    )


async def store_all(srv: Server, convs: list[Conversation], fmt: str, concurrency: int) -> set[str]:
    """Store every turn (``concurrency`` calls in flight); the memory ids."""
    import anyio

    todo = [
        (conv.namespace, t.content(fmt), request_id(conv, t, fmt))
        for conv in convs
        for t in conv.turns
    ]
    async with mcp_session(srv.mcp_url, srv.api_key) as call:
        grant_if_short(srv, await call("check_balance"), len(todo))
    memory_ids: set[str] = set()
    queue = iter(todo)
    done = 0
    last = 0.0

    async def worker() -> None:
        nonlocal done, last
        async with mcp_session(srv.mcp_url, srv.api_key) as call:
            for namespace, content, rid in queue:
                r = await call_retrying(
                    call, "store", content=content, request_id=rid, namespace=namespace
                )
                memory_ids.add(str(r["memory_id"]))
                done += 1
                if time.monotonic() - last > 2 or done == len(todo):
                    last = time.monotonic()
                    say(f"  stores accepted {done:,}/{len(todo):,}")

    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return memory_ids


async def wait_landed(srv: Server, expected: int, stall_seconds: float = 300) -> None:
    """Until check_runway's account summary shows nothing storing and every store active."""
    import anyio

    async with mcp_session(srv.mcp_url, srv.api_key) as call:
        best, since, shown = -1, time.monotonic(), (-1, 0.0)
        while True:
            acct = (await call("check_runway"))["account"]
            total, active = int(acct["total_memories"]), int(acct["active"])
            settled = active + int(acct["paused"]) + int(acct["no_renew"])
            if active != shown[0] and time.monotonic() - shown[1] > 2:
                shown = (active, time.monotonic())
                say(f"  stores landed {active:,}/{total:,} (this run's: {expected:,})")
            if settled >= total and total >= expected:
                if active < expected:
                    raise SystemExit(
                        f"only {active:,} of {expected:,} memories are active after landing"
                    )
                say(f"  stores landed {active:,}/{total:,}")
                return
            if active > best:
                best, since = active, time.monotonic()
            elif time.monotonic() - since > stall_seconds:
                raise SystemExit(
                    f"landing stalled at {active:,}/{total:,} for {stall_seconds:.0f} s; "
                    f"server log: {srv.log}"
                )
            await anyio.sleep(1.0)


async def ask_all(
    servers: dict[str, Server], convs: list[Conversation], fmt: str
) -> dict[str, Scored]:
    """Every question to every server; with several, each question goes to each in turn
    (the first one rotating), so the machine's drift in speed hits them all alike."""
    scored = {r: Scored() for r in servers}
    total = sum(len(c.questions) for c in convs)
    start = time.perf_counter()
    async with contextlib.AsyncExitStack() as stack:
        calls = {
            r: await stack.enter_async_context(mcp_session(srv.mcp_url, srv.api_key))
            for r, srv in servers.items()
        }
        # One untimed recall per namespace first: the model and the index cache load.
        for call in calls.values():
            for conv in convs:
                await call_retrying(
                    call, "recall", query="warm-up", namespace=conv.namespace, limit=LIMIT
                )
        names = list(calls)
        asked = 0
        for conv in convs:
            turn_ids = turn_index(conv, fmt)
            for q in conv.questions:
                for j in range(len(names)):
                    r = names[(asked + j) % len(names)]
                    t0 = time.perf_counter()
                    res = await call_retrying(
                        calls[r], "recall", query=q.text, namespace=conv.namespace, limit=LIMIT
                    )
                    ms = (time.perf_counter() - t0) * 1000
                    scored[r].add(q, [str(h["content"]) for h in res["results"]], turn_ids, ms)
                asked += 1
                if asked % 200 == 0 or asked == total:
                    say(f"  questions asked {asked:,}/{total:,}")
    for sc in scored.values():
        sc.seconds = time.perf_counter() - start
    return scored


def check_manifest(data_dir: Path, fmt: str, mode: str) -> None:
    """A kept data directory holds one format (mixing two would rank both) and serves one
    mode (a server's first run makes its key only on an empty database)."""
    path = data_dir / MANIFEST
    want = {"format": fmt, "mode": mode}
    if path.exists():
        kept = json.loads(path.read_text())
        if kept != want:
            raise SystemExit(
                f"{data_dir} holds memories of format {kept.get('format')}, "
                f"mode {kept.get('mode')}; use another --keep directory for {fmt}, {mode}"
            )
    elif data_dir.exists() and any(data_dir.iterdir()):
        raise SystemExit(f"{data_dir} is not empty and not this benchmark's: choose another")
    else:
        data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(want) + "\n")


def interleaved(
    data_dir: Path, convs: list[Conversation], fmt: str, rankings: list[str]
) -> dict[str, Scored]:
    """One server per ranking at once, each on its own copy of the landed data directory
    (two servers never share one database), every question asked of each in turn."""
    import anyio

    copies = Path(tempfile.mkdtemp(prefix="walkeep-recall-quality-copies-"))
    servers: dict[str, Server] = {}
    try:
        for ranking in rankings:
            copy = copies / ranking
            shutil.copytree(data_dir, copy)
            say(f"ranking {ranking}: walkeep serve on a copy, {RANKING_ENV}={ranking}")
            servers[ranking] = Server(copy, copy / "recall-quality-serve.log", ranking)
        results = anyio.run(ask_all, servers, convs, fmt)
        say(f"rankings interleaved: {next(iter(results.values())).seconds:.1f} s")
        return results
    finally:
        for srv in servers.values():
            srv.stop()
        shutil.rmtree(copies, ignore_errors=True)


def run_served(
    convs: list[Conversation],
    fmt: str,
    rankings: list[str],
    keep: Path | None,
    concurrency: int,
    interleave: bool = False,
) -> dict[str, Scored]:
    import anyio

    tmp = None if keep else tempfile.mkdtemp(prefix="walkeep-recall-quality-")
    data_dir = keep.resolve() if keep else Path(tmp or "") / "data"
    check_manifest(data_dir, fmt, "served")
    log = data_dir / "recall-quality-serve.log"
    say(f"data dir {data_dir}; server log {log}")
    results: dict[str, Scored] = {}
    ok = False
    try:
        t0 = time.perf_counter()
        srv = Server(data_dir, log, None)
        try:
            ids = anyio.run(store_all, srv, convs, fmt, concurrency)
            t1 = time.perf_counter()
            anyio.run(wait_landed, srv, len(ids))
        finally:
            srv.stop()
        t2 = time.perf_counter()
        say(
            f"stored {len(ids):,} memories in {t1 - t0:.1f} s (incl. server start), "
            f"all landed {t2 - t1:.1f} s later"
        )
        if interleave:
            results = interleaved(data_dir, convs, fmt, rankings)
        else:
            for ranking in rankings:
                say(f"ranking {ranking}: restarting walkeep serve with {RANKING_ENV}={ranking}")
                srv = Server(data_dir, log, ranking)
                try:
                    results |= anyio.run(ask_all, {ranking: srv}, convs, fmt)
                finally:
                    srv.stop()
                say(f"ranking {ranking}: {results[ranking].seconds:.1f} s")
        ok = True
    finally:
        if tmp is not None and ok:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            say(f"kept {tmp} for a look at what went wrong")
    return results


# --- in process ---------------------------------------------------------------------------


def ranked_settings(base: dict[str, Any], ranking: str | None) -> Any:
    """Settings for ``ranking``: the ``recall_ranking`` field once Settings has it, and
    ``WALKEEP_RECALL_RANKING`` in the environment (read as that field by pydantic-settings,
    or by any code that looks at the variable itself)."""
    from walkeep.config import Settings

    if ranking is None:
        os.environ.pop(RANKING_ENV, None)
    else:
        os.environ[RANKING_ENV] = ranking
    kw = dict(base)
    if ranking is not None and "recall_ranking" in Settings.model_fields:
        kw["recall_ranking"] = ranking
    return Settings(**kw)


def run_in_process(
    convs: list[Conversation], fmt: str, rankings: list[str], keep: Path | None
) -> dict[str, Scored]:
    from walkeep import ledger
    from walkeep.bootstrap import build_runtime
    from walkeep.db import migrate
    from walkeep.service.jobs import completion
    from walkeep.service.operators import accounts
    from walkeep.service.tools import runway, store
    from walkeep.service.tools.balance import check_balance
    from walkeep.service.tools.recall import recall

    tmp = None if keep else tempfile.mkdtemp(prefix="walkeep-recall-quality-")
    data_dir = keep.resolve() if keep else Path(tmp or "") / "data"
    check_manifest(data_dir, fmt, "in-process")
    url = f"sqlite:///{data_dir / 'walkeep.db'}"
    base: dict[str, Any] = {
        "data_dir": data_dir,
        "database_url": url,
        "local_write_latency_ms": 0,
        "quilt_window_seconds": 0,
        "max_stores_per_day": 10_000_000,
    }
    saved_env = os.environ.get(RANKING_ENV)
    results: dict[str, Scored] = {}
    say(f"data dir {data_dir} (in process)")
    try:
        migrate.upgrade(url)
        t0 = time.perf_counter()
        rt = build_runtime(ranked_settings(base, None), with_completer=False)
        found = accounts.find_account_by_name(rt.db, "recall-quality")
        todo = [(conv, t) for conv in convs for t in conv.turns]
        if found is None:
            account_id = accounts.create_account(
                rt.db, "recall-quality", credits_mc=ledger.usd_to_mc(PROMO_USD)
            ).account_id
        else:  # a kept directory: top it up if its credits would not cover this run
            account_id = found
            if check_balance(rt, account_id).est_memories_remaining < len(todo):
                accounts.grant(rt.db, account_id, ledger.usd_to_mc(PROMO_USD), reason="benchmark")
        memory_ids = set()
        for i, (conv, t) in enumerate(todo, 1):
            r = store.store(
                rt,
                account_id,
                content=t.content(fmt),
                request_id=request_id(conv, t, fmt),
                namespace=conv.namespace,
            )
            memory_ids.add(r.memory_id)
            if i % 500 == 0 or i == len(todo):
                say(f"  stores accepted {i:,}/{len(todo):,}")
        t1 = time.perf_counter()
        while True:
            completion.complete_writes(rt)
            acct = runway.check_runway(rt, account_id).account
            assert acct is not None
            say(f"  stores landed {acct.active:,}/{acct.total_memories:,}")
            if acct.active + acct.paused + acct.no_renew >= acct.total_memories:
                break
        if acct.active < len(memory_ids):
            raise SystemExit(f"only {acct.active:,} of {len(memory_ids):,} memories landed")
        rt.db.dispose()
        say(
            f"stored {len(memory_ids):,} memories in {t1 - t0:.1f} s, landed in {time.perf_counter() - t1:.1f} s"
        )

        for ranking in rankings:
            rt = build_runtime(ranked_settings(base, ranking), with_completer=False)
            scored = Scored()
            start = time.perf_counter()
            for conv in convs:  # untimed: the model and the index cache load
                recall(rt, account_id, query="warm-up", namespace=conv.namespace, limit=LIMIT)
            total = sum(len(c.questions) for c in convs)
            asked = 0
            for conv in convs:
                turn_ids = turn_index(conv, fmt)
                for q in conv.questions:
                    q0 = time.perf_counter()
                    res = recall(
                        rt, account_id, query=q.text, namespace=conv.namespace, limit=LIMIT
                    )
                    ms = (time.perf_counter() - q0) * 1000
                    scored.add(q, [h.content for h in res.results], turn_ids, ms)
                    asked += 1
                    if asked % 200 == 0 or asked == total:
                        say(f"  [{ranking}] questions asked {asked:,}/{total:,}")
            scored.seconds = time.perf_counter() - start
            results[ranking] = scored
            rt.db.dispose()
            say(f"ranking {ranking}: {scored.seconds:.1f} s")
    finally:
        if saved_env is None:
            os.environ.pop(RANKING_ENV, None)
        else:
            os.environ[RANKING_ENV] = saved_env
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


# --- report -------------------------------------------------------------------------------


def report(results: dict[str, Scored], split_name: str, fmt: str, mode: str) -> None:
    cols = ("recall@1", "recall@5", "recall@10", "hit@5", "MRR", "p50 ms", "p95 ms")
    print(f"\nrecall quality ({mode}, split={split_name}, format={fmt}, limit {LIMIT})")
    print(f"{'ranking':<10}" + "".join(f"{c:>11}" for c in cols))
    for ranking, s in results.items():
        f = s.figures()
        vals = [f["recall_at_1"], f["recall_at_5"], f["recall_at_10"], f["hit_at_5"], f["mrr"]]
        print(
            f"{ranking:<10}"
            + "".join(f"{v:>11.3f}" for v in vals)
            + f"{f['p50_ms']:>11.1f}{f['p95_ms']:>11.1f}"
        )
    print("recall@5 by LoCoMo category (questions):")
    for ranking, s in results.items():
        parts = [f"cat {c} {v:.3f} ({n})" for c, (n, v) in s.by_category().items()]
        print(f"  {ranking:<8} " + ", ".join(parts))
    for ranking, s in results.items():
        if s.unknown_hits:
            print(f"note: {ranking}: {s.unknown_hits} hits matched no stored turn's content")
    names = list(results)
    if len(names) > 1 and all(results[n].lists == results[names[0]].lists for n in names[1:]):
        print(
            f"note: every ranking returned the same lists for every question: this build "
            f"does not seem to read {RANKING_ENV} (or recall_ranking)"
        )
    print()
    for ranking, s in results.items():
        f = s.figures()
        print(
            f"RECALL_QUALITY ranking={ranking} split={split_name} format={fmt} "
            f"questions={len(s.r5)} recall_at_1={f['recall_at_1']:.3f} "
            f"recall_at_5={f['recall_at_5']:.3f} recall_at_10={f['recall_at_10']:.3f} "
            f"hit_at_5={f['hit_at_5']:.3f} mrr={f['mrr']:.3f} "
            f"p50_ms={f['p50_ms']:.1f} p95_ms={f['p95_ms']:.1f}"
        )


def walkeep_under_test() -> str:
    """Where the measured code comes from, and its commit when it is a checkout."""
    import walkeep

    where = Path(walkeep.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{where}" + (f" ({commit})" if commit else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, help="LoCoMo: a directory, a .zip or a .json")
    ap.add_argument("--split", choices=["dev", "test", "all"], default="test")
    ap.add_argument("--format", choices=["dated", "plain"], default="dated", dest="fmt")
    ap.add_argument(
        "--rankings",
        default=",".join(RANKINGS),
        help="comma-separated, of: " + ", ".join(RANKINGS),
    )
    ap.add_argument("--in-process", action="store_true", help="no server: service functions")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="data directory to keep (reused)")
    ap.add_argument("--limit-conversations", type=int, metavar="N", help="the split's first N")
    ap.add_argument("--concurrency", type=int, default=4, help="stores in flight (server mode)")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="server mode: run one server per ranking at once (each on a copy of the data) "
        "and ask each question of each in turn, so latencies compare under the same load",
    )
    args = ap.parse_args(argv)

    rankings = [r.strip() for r in args.rankings.split(",") if r.strip()]
    bad = [r for r in rankings if r not in RANKINGS]
    if bad or not rankings:
        ap.error(f"--rankings: unknown {bad}; choose from {', '.join(RANKINGS)}")

    source = args.data if args.data is not None else fetch_dataset()
    if not source.exists():
        raise SystemExit(f"--data {source}: no such file or directory")
    every = load_conversations(source)
    convs = split(every, args.split)
    if args.limit_conversations is not None:
        convs = convs[: args.limit_conversations]
    if not convs:
        raise SystemExit(f"no conversations in split {args.split!r} of {len(every)}")

    print(f"dataset: {DATASET} — licence {LICENCE}")
    print(f"source:  {source}")
    print(f"walkeep: {walkeep_under_test()}")
    print(
        f"split {args.split}: conversations {', '.join(c.conv_id for c in convs)} "
        f"({len(convs)} of {len(every)}); "
        f"turns {sum(len(c.turns) for c in convs):,}; "
        f"questions {sum(len(c.questions) for c in convs):,} "
        f"(skipped: {sum(c.adversarial for c in convs)} adversarial (category 5), "
        f"{sum(c.no_evidence for c in convs)} without valid evidence; "
        f"{sum(c.dropped_ids for c in convs)} evidence ids naming no turn dropped)"
    )
    sys.stdout.flush()

    start = time.perf_counter()
    if args.in_process:
        results = run_in_process(convs, args.fmt, rankings, args.keep)
        mode = "in process"
    else:
        results = run_served(
            convs, args.fmt, rankings, args.keep, args.concurrency, args.interleave
        )
        mode = "walkeep serve + MCP client" + (", interleaved" if args.interleave else "")
    report(results, args.split, args.fmt, mode)
    print(f"total time {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
