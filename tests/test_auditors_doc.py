"""What the docs say an auditor sees is what an auditor sees (issue 39).

- docs/auditors.md shows ``walkeep verify``'s output as ``bench/auditors.py`` prints it
  now: its blocks must match a fresh run, identifiers (object ids, digests, memory ids)
  aside — a new fact, a changed figure or a FAIL fails this test until the document is
  regenerated (``python bench/auditors.py --write``);
- the README's auditor walk, followed as written — ``walkeep serve`` with the epoch
  length it gives, a few memories stored with the Python client, a wait for the first
  renewal, then its ``walkeep verify`` lines — ends in ``OK``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from bench import auditors
from tests.live_serve import walkeep_env, walkeep_serve
from walkeep.client import WalkeepClient

ROOT = Path(__file__).resolve().parent.parent


def test_the_documented_verify_output_is_what_walkeep_verify_prints_now(tmp_path: Path) -> None:
    outputs = auditors.walk(tmp_path)
    doc = auditors.DOC.read_text()
    for name in auditors.BLOCKS:
        found = auditors.block_pattern(name).search(doc)
        assert found, f"docs/auditors.md has no generated `{name}` block"
        documented = auditors.normalized(found.group(2)).splitlines()
        now = auditors.normalized(outputs[name]).splitlines()
        assert documented == now, (
            f"docs/auditors.md's `{name}` block drifted from `walkeep verify`: "
            "run `python bench/auditors.py --write`"
        )
        assert now[-1].startswith("OK: ") and not any(line.startswith("FAIL") for line in now)
    assert re.search(r"<!-- verify:stamp -->\d{4}-\d\d-\d\d, commit \w+", doc)


def test_normalizing_keeps_every_figure() -> None:
    """The comparison forgives identifiers only: a changed number still differs."""
    line = "PASS call 0 cost: 189 mc billed, ⌊63.000000 kept units × 3 epochs × 1 mc⌋"
    assert auditors.normalized(line) == line
    assert auditors.normalized(line.replace("189", "190")) != auditors.normalized(line)
    ids = (
        "PASS [HBVFZtWoeL…] blob object: chain 0x" + "ab" * 32 + " mem_4f31kksgfkrmk8pct7dad760re"
        " HBVFZtWoeLbYyHK8ZDpsSgSW6iXbR4xjETDBuLwQWURj"
    )
    assert auditors.normalized(ids) == "PASS […] blob object: chain 0x… mem_… <digest>"


def _readme_walk() -> tuple[dict[str, str], list[list[str]]]:
    """The README's auditor section: the environment its ``walkeep serve`` line sets,
    and its ``walkeep verify`` command lines (as argument lists)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Auditing a renewal") :]
    section = section[: section.index("\n## ", 3)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for b in blocks for line in b.splitlines()]
    (serve,) = [line for line in lines if " walkeep serve" in f" {line}"]
    env = dict(word.split("=", 1) for word in serve.split() if "=" in word)
    verifies = [line.split()[1:] for line in lines if line.startswith("walkeep verify")]
    assert env and len(verifies) == 2, (serve, verifies)
    return env, verifies


def test_the_readme_auditor_walk_ends_in_ok(tmp_path: Path, db_url: str) -> None:
    env, verifies = _readme_walk()
    with walkeep_serve(tmp_path, db_url, **env) as live:
        with WalkeepClient(live.url, api_key=live.api_key) as wk:
            ids = [
                wk.store(text, request_id=f"walk-{i}").memory_id
                for i, text in enumerate(auditors.CONTENTS)
            ]
            for mid in ids:
                wk.wait_until_stored(mid, timeout=60)
            deadline = time.monotonic() + 120
            while (digest := wk.check_runway(ids[0]).memories[0].last_renewal_tx) is None:
                assert time.monotonic() < deadline, "no renewal in two minutes"
                time.sleep(0.5)
        cli_env = walkeep_env(tmp_path / "serve-data", db_url, **env)
        for args in verifies:
            argv = [{"mem_…": ids[0], "<digest>": digest}.get(word, word) for word in args]
            for _attempt in range(20):
                done = subprocess.run(
                    [sys.executable, "-m", "walkeep.cli", *argv],
                    env=cli_env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                # A renewal caught between its intent and its record says "run it again".
                if "still an intent" not in done.stdout:
                    break
                time.sleep(0.5)
            last = done.stdout.strip().splitlines()[-1]
            assert done.returncode == 0 and last.startswith("OK: "), done.stdout + done.stderr
