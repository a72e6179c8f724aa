"""The README's worked configuration, `deploy/configs/llama-to-mlx.toml`, run as a user would run
it: llama-server as the primary and mlx_lm.server as the candidate, both managed, agents' sampled
traffic shadowed and judged through greedy replays, then a release started, looked at and aborted
with the README's own commands.

The file is used as shipped but for what must differ on this machine, each named in
`localized()`: the two artifacts (the bundled model as GGUF and as its MLX conversion), the
engines' programs (the pinned llama-server; mlx_lm from the test venv, with its offline Hugging
Face home), the addresses (free ports), the ledger's path, the llama-server binary as identity (a
build from a source tarball names no version: see docs/api.md), and the shadow's `sample` raised
to 1.0 so that every request gives evidence.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

from test_equivalence import PROMPTS
from test_real_engines import (
    REQUEST_TIMEOUT_S,
    free_port,
    http_client,
    identities_settled,
    poll,
    required_path,
    run_switchyard,
    start_switchyard,
)

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "configs" / "llama-to-mlx.toml"
#: Requests sent, each sampled as an agent's are (temperature 0.7), under a name of the agent's.
SENT = 4


def replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the shipped configuration no longer has exactly one {old!r}"
    return text.replace(old, new)


def localized(workdir: Path) -> tuple[str, str, Path]:
    """The shipped file with this machine's paths and ports; returns it, the admin address and
    the ledger's path."""
    text = SHIPPED.read_text()
    llama_bin = required_path("LLAMA_SERVER_BIN")
    mlx_python = required_path("MLX_PYTHON")
    admin = f"127.0.0.1:{free_port()}"
    db = workdir / "switchyard.db"
    for old, new in [
        ('"/Users/me/models/qwen2.5-coder-7b-instruct-q4_k_m.gguf"', json.dumps(str(required_path("SMOLLM2_GGUF")))),
        ('"/Users/me/models/qwen2.5-coder-7b-instruct-4bit"', json.dumps(str(required_path("MLX_MODEL_DIR")))),
        ('command = ["llama-server", ', f"command = [{json.dumps(str(llama_bin))}, "),
        ('command = ["mlx_lm.server", ', f'env = {{ HF_HOME = {json.dumps(str(required_path("MLX_HF_HOME")))}, HF_HUB_OFFLINE = "1" }}\n'
                                        f'command = [{json.dumps(str(mlx_python))}, "-m", "mlx_lm", "server", '),
        ('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:0"\nfirst_byte_timeout_ms = 120000'),
        ('listen = "127.0.0.1:8090"', f'listen = "{admin}"'),
        ('path = "switchyard.db"', f"path = {json.dumps(str(db))}"),
        ('engine = "llama.cpp"\n', f'engine = "llama.cpp"\nbinary = {json.dumps(str(llama_bin))}\n'),
        ("sample = 0.25", "sample = 1.0"),
    ]:
        text = replace_once(text, old, new)
    return text, admin, db


def test_the_readmes_worked_configuration_shadows_then_releases(tmp_path: Path) -> None:
    config, admin, db = localized(tmp_path)
    path = tmp_path / "llama-to-mlx.toml"
    path.write_text(config)
    checked = run_switchyard("check", "--config", str(path))
    assert checked.strip() == f"{path}: ok (2 backends, 1 models)", checked

    # Both engines started at boot, their identities verified and their builds known.
    with start_switchyard(tmp_path, config, identities_settled("llama", "mlx")) as p, http_client(timeout=10.0) as http:

        def settled() -> float:
            """Sampled requests whose evidence is in: a replayed pair judged, or a replay that
            yielded to live traffic."""
            total = 0.0
            for line in http.get(f"{p.url}/metrics").text.splitlines():
                if line.startswith("switchyard_shadow_replays_total{") and re.search(r'outcome="(replayed|busy)"', line):
                    total += float(line.rsplit(" ", 1)[1])
            return total

        client = p.client()
        for sent, prompt in enumerate(PROMPTS[1 : 2 * SENT : 2], start=1):
            answer = client.chat.completions.with_raw_response.create(
                model="claude-sonnet-4-5", messages=[{"role": "user", "content": prompt}], max_tokens=32, temperature=0.7
            )
            # The agent's own model name is taken by the catch-all pattern, served by llama-server.
            assert answer.headers["x-switchyard-backend"] == "llama", answer.headers
            assert answer.headers["x-switchyard-model-pattern"] == "*", answer.headers
            assert answer.parse().choices[0].message.content
            poll("the request's replay", lambda n=sent: settled() >= n, p.proc, timeout=REQUEST_TIMEOUT_S)

        # Step 2 of the README: a release on the plan the file declares, looked at, then aborted.
        admin_url = f"http://{admin}"
        started = run_switchyard("release", "start", "coder", "--candidate", "mlx", "--plan", "to-mlx", "--url", admin_url)
        rid = re.search(r"\b(rel_[0-9A-Za-z]+)\b", started)
        assert rid, started
        status = run_switchyard("release", "status", "--url", admin_url)
        assert rid.group(1) in status and "shadow" in status, status
        run_switchyard("release", "abort", rid.group(1), "--reason", "the worked configuration's test ends", "--url", admin_url)
        release = http.get(f"{admin_url}/admin/releases/{rid.group(1)}").json()["release"]
        assert release["state"] == "aborted", release
        metrics = http.get(f"{p.url}/metrics").text
        replayed = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("switchyard_shadow_replays_total{") and 'outcome="replayed"' in line
        )

    rows = sqlite3.connect(db).execute("SELECT mode, verdict, reason FROM comparisons ORDER BY id").fetchall()
    live = [r for r in rows if r[0] != "replay"]
    replays = [r for r in rows if r[0] == "replay"]
    # One pair per request. Sampled pairs cannot be compared as sent: each is judged on its
    # greedy replay (the replay's verdict is the pair's), or, had a replay yielded to live
    # traffic (counted `busy`), recorded as the incomparable pair it is.
    assert len(rows) == SENT, rows
    assert len(replays) == replayed >= 1, (replayed, rows)
    assert all(r[1] in ("match", "equivalent", "mismatch") for r in replays), rows
    assert all(r[1] == "incomparable" for r in live), rows
    report = run_switchyard("report", "--ledger", str(db), "--comparisons")
    assert "mlx" in report, report
