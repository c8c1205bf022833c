"""The real output of ``walkeep verify`` that docs/auditors.md shows, produced here, not typed.

Runs the README's auditor walk on a fresh local network in a temporary directory — four
small memories of one account stored (they pack into one quilt), landed, the clock moved
three epochs, the worker's renewal job run — and then the real CLI, ``walkeep verify
<digest>`` and ``walkeep verify --memory <id>``, in a process of its own against that
data directory. The clock is Walkeep's injectable one, so every figure (epochs,
millicredits, units, FROST) is the same on every run; only identifiers (object ids,
digests, the wallet, memory ids) differ.

    python bench/auditors.py           # print both outputs
    python bench/auditors.py --write   # and replace them in docs/auditors.md

``tests/test_auditors_doc.py`` runs it and fails when the document's blocks differ from
what it prints now (identifiers aside).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "auditors.md"
# The memories of the walk: what an agent might store (they pack into one quilt).
CONTENTS = (
    "(8 May 2023) Caroline said she adopted a cat named Oscar.",
    "The user prefers metric units.",
    "Deploys happen on Tuesdays.",
    "Melanie ran a charity race for mental health on 20 May 2023.",
)
BLOCKS = ("digest", "memory")


def walk(workdir: Path) -> dict[str, str]:
    """Run the walk in ``workdir``; the stdout of each verify command, by block name."""
    from walkeep.bootstrap import build_runtime
    from walkeep.clock import ManualClock
    from walkeep.config import Settings
    from walkeep.db import Database
    from walkeep.db import migrate as migrations
    from walkeep.scheduler.jobs import run_job
    from walkeep.service.jobs import completion
    from walkeep.service.operators import accounts
    from walkeep.service.tools import store

    data_dir, db_url = workdir / "data", f"sqlite:///{workdir / 'walkeep.db'}"
    settings = Settings(
        data_dir=data_dir,
        database_url=db_url,
        embedder="hash",
        local_write_latency_ms=0,
        quilt_window_seconds=0,
    )
    migrations.upgrade(db_url)
    clock = ManualClock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    db = Database(db_url, clock=clock)
    try:
        rt = build_runtime(settings, clock=clock, database=db, with_completer=False)
        acct = accounts.create_account(db, "default", credits_mc=100_000).account_id
        ids = [
            store.store(rt, acct, content=text, request_id=f"walk-{i}").memory_id
            for i, text in enumerate(CONTENTS)
        ]
        completion.complete_writes(rt)
        clock.advance(rt.chain.epoch_info().duration_seconds * 3)  # runway 2: due
        (digest,) = run_job(rt, "renew").digests
    finally:
        db.dispose()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WALKEEP_", "STRIPE_"))},
        "HOME": str(workdir),
        "WALKEEP_DATA_DIR": str(data_dir),
        "WALKEEP_DATABASE_URL": db_url,
        "WALKEEP_EMBEDDER": "hash",
    }
    out: dict[str, str] = {}
    for name, args in (("digest", [digest]), ("memory", ["--memory", ids[0]])):
        done = subprocess.run(
            [sys.executable, "-m", "walkeep.cli", "verify", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"walkeep verify {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        out[name] = done.stdout.rstrip("\n")
    return out


def block_pattern(name: str) -> re.Pattern[str]:
    """A generated block in the document: ``<!-- verify:NAME -->``, a code block, the end."""
    return re.compile(
        rf"(<!-- verify:{name} -->\n)```text\n(.*?)\n```\n(<!-- /verify:{name} -->)", re.S
    )


def normalized(text: str) -> str:
    """The output with the identifiers a new network changes replaced: what must not drift."""
    text = re.sub(r"0x[0-9a-f]{64}", "0x…", text)
    text = re.sub(r"\bmem_[0-9A-Za-z]+", "mem_…", text)
    text = re.sub(r"\[[1-9A-HJ-NP-Za-km-z]{10}…\]", "[…]", text)
    return re.sub(r"\b[1-9A-HJ-NP-Za-km-z]{43,44}\b", "<digest>", text)


def _stamp() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    day = datetime.now(UTC).date().isoformat()
    return (
        f"<!-- verify:stamp -->{day}, commit {commit}, `python bench/auditors.py --write`"
        "<!-- /verify:stamp -->"
    )


def write(outputs: dict[str, str]) -> None:
    doc = DOC.read_text()
    for name in BLOCKS:
        pattern = block_pattern(name)
        if not pattern.search(doc):
            raise SystemExit(f"{DOC}: no <!-- verify:{name} --> block to replace")
        doc = pattern.sub(
            lambda m, name=name: f"{m.group(1)}```text\n{outputs[name]}\n```\n{m.group(3)}", doc
        )
    doc = re.sub(r"<!-- verify:stamp -->.*?<!-- /verify:stamp -->", _stamp(), doc, flags=re.S)
    DOC.write_text(doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the blocks in {DOC}")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="walkeep-auditors-") as tmp:
        outputs = walk(Path(tmp))
    for name in BLOCKS:
        print(f"--- walkeep verify ({name}) ---\n{outputs[name]}\n")
    if args.write:
        write(outputs)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
