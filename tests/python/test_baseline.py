"""`switchyard baseline` on the quickstart's engine: the REAL llama-server with the bundled
SmolLM2 GGUF, which Switchyard does not run itself, configured from
deploy/configs/quickstart.toml.in as deploy/quickstart fills it in (a llama-server built from
source reports build b0-unknown, so its identity is its binary's digest).

The record's identity is that engine's, and its warm figures are the engine's own timings as the
ledger holds them. `baseline diff` of the record with itself compares; against a record of
another artifact (the same suite, taken by the same command from the fake engine serving another
model file) it is refused, naming the artifact.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
import subprocess
from pathlib import Path

from conftest import Proc, binary, child_env, http_client
from test_real_engines import free_port, poll, required_path, sha256_file

REPO = Path(__file__).resolve().parents[2]
#: Each run of `switchyard baseline` here: three short requests, three times each.
RUN_TIMEOUT_S = 300

SUITE = [
    {"model": "smollm2", "messages": [{"role": "user", "content": "Name a colour."}],
     "temperature": 0, "max_tokens": 8, "stream": True},
    {"model": "smollm2", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
     "temperature": 0, "max_tokens": 8, "stream": True},
    {"model": "smollm2", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 8},
]


def quickstart_config(tmp: Path, llama_url: str) -> Path:
    text = (REPO / "deploy" / "configs" / "quickstart.toml.in").read_text()
    for placeholder, value in {
        "@LLAMA_URL@": llama_url,
        "@MODEL@": str(required_path("SMOLLM2_GGUF")),
        "@LLAMA_BIN@": str(required_path("LLAMA_SERVER_BIN")),
        "@LISTEN@": "127.0.0.1:0",
        "@LEDGER@": str(tmp / "quickstart.db"),
    }.items():
        text = text.replace(placeholder, value)
    assert "@" not in text, text
    path = tmp / "quickstart.toml"
    path.write_text(text)
    return path


def fake_engine_config(tmp: Path) -> Path:
    """The fake engine, run by Switchyard, serving a model file of its own as `smollm2`."""
    model = tmp / "other.gguf"
    model.write_text("another model")
    path = tmp / "fake.toml"
    path.write_text(f"""
[server]
listen = "127.0.0.1:0"
state_dir = "{tmp}"

[backends.llama]
engine = "llama.cpp"
artifact = "{model}"
[backends.llama.launch]
command = ["{binary('FAKE_ENGINE_BIN', 'fake-engine')}", "--listen", "127.0.0.1:${{port}}", "--model-path", "${{artifact}}"]

[models.smollm2]
primary = "llama"
""")
    return path


def switchyard(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary("SWITCHYARD_BIN", "switchyard")), *args],
        env=child_env(), cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False,
    )


def take(config: Path, suite: Path, out: Path, *extra: str) -> dict:
    done = switchyard("baseline", "--config", str(config), "--suite", str(suite), "--backend", "llama",
                      "--repeat", "2", "--out", str(out), "--format", "json", *extra, cwd=out.parent)
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(done.stdout)
    assert json.loads((out / "baseline.json").read_text()) == record
    return record


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1]


def test_a_baseline_of_the_quickstart_engine_is_its_own_and_another_artifact_is_not_diffed(tmp_path: Path) -> None:
    port = free_port()
    llama_url = f"http://127.0.0.1:{port}"
    gguf, llama_bin = required_path("SMOLLM2_GGUF"), required_path("LLAMA_SERVER_BIN")
    engine = Proc("llama-baseline", [str(llama_bin), "-m", str(gguf), "-c", "2048", "--host", "127.0.0.1",
                                     "--port", str(port)], tmp_path / "llama.log")
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(r) + "\n" for r in SUITE))
    try:
        with http_client(timeout=5.0) as http:
            poll("llama-server", lambda: http.get(f"{llama_url}/health").status_code == 200, engine)
            build = http.get(f"{llama_url}/props").json()["build_info"]
        record = take(quickstart_config(tmp_path, llama_url), suite, tmp_path / "quickstart",
                      "--decision", "keep SmolLM2 Q4_1 on llama-server for the quickstart", "--owner", "tests",
                      "--retest", "2099-12-31")
    finally:
        engine.stop()

    identity = record["identity"]
    want_engine = f"llama.cpp/sha256:{sha256_file(llama_bin)}" if build == "b0-unknown" else f"llama.cpp/{build}"
    assert identity["engine"] == want_engine
    assert identity["artifact"] == f"sha256:{sha256_file(gguf)}" and identity["artifact_verified"] is True
    assert (identity["backend"], identity["engine_kind"], identity["url"]) == ("llama", "llama.cpp", llama_url)
    # Not run by Switchyard: no flags or memory, and the record says why.
    assert record["launch"] is None and "not run by Switchyard" in record["launch_unknown"]
    assert record["peak_memory"] is None and "not run by Switchyard" in record["peak_memory_unknown"]
    assert (record["workload"]["requests"], record["workload"]["repeat"]) == (3, 2)
    assert record["failures"] == {"count": 0, "abstentions": 0, "runs": []}
    assert record["decision"]["owner"] == "tests" and record["decision"]["retest"] == "2099-12-31"
    phases = record["phases"]
    assert (phases["total_ms"]["cold"]["n"], phases["total_ms"]["warm"]["n"]) == (3, 6)
    assert (phases["ttft_ms"]["cold"]["n"], phases["ttft_ms"]["warm"]["n"]) == (2, 4)
    assert phases["decode_tok_s"]["source"] == "engine" and phases["prefill_tok_s"]["source"] == "engine"

    # The warm figures are the engine's own timings of these very runs, as the ledger holds them.
    with contextlib.closing(sqlite3.connect(tmp_path / "quickstart.db")) as conn:
        rows = conn.execute(
            "SELECT engine, artifact, workload, decode_tokens, decode_ms, decode_source, total_ms FROM requests"
            " WHERE variant = 'baseline' AND warm = 1").fetchall()
    assert len(rows) == 6
    assert {(r[0], r[1]) for r in rows} == {(identity["engine"], identity["artifact"])}
    assert {r[2] for r in rows} == {i["workload"] for i in record["workload"]["items"]}
    assert {r[5] for r in rows} == {"engine"}
    decode = [tokens / (ms / 1000) for (_, _, _, tokens, ms, _, _) in rows]
    for p in (50, 95):
        assert math.isclose(phases["decode_tok_s"]["warm"][f"p{p}"], nearest_rank(decode, p), abs_tol=0.001)
        assert math.isclose(phases["total_ms"]["warm"][f"p{p}"], nearest_rank([r[6] for r in rows], p), abs_tol=0.001)
    assert phases["decode_tok_s"]["warm"]["p50"] > 0

    mine = str(tmp_path / "quickstart" / "baseline.json")
    same = switchyard("baseline", "diff", mine, mine, "--format", "json", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["comparable"] is True

    # The same suite on another model file: refused, naming the artifact.
    other = take(fake_engine_config(tmp_path), suite, tmp_path / "other")
    assert other["workload"]["fingerprint"] == record["workload"]["fingerprint"]
    refused = switchyard("baseline", "diff", mine, str(tmp_path / "other" / "baseline.json"), cwd=tmp_path)
    assert refused.returncode == 1, refused.stdout
    assert refused.stdout.startswith("# Baseline diff: refused")
    assert "identity.artifact differs" in refused.stdout and "identity.artifact differs" in refused.stderr
