"""Evidence across engines, on the REAL engines (issue 44): canary releases of the bundled model
from llama-server (Q4_1 GGUF) to three candidates of the same model, each judged by the
equivalence rule on traffic that is half greedy and half sampled:

- llama-server on a Q8_0 requantization of the same file (`llama-quantize --allow-requantize`),
- mlx_lm.server on the MLX conversion of the same weights,
- llama-server on a Q2_K requantization.

The first two part from the primary only at near ties and are promoted; the Q2_K one parts at a
confident choice and is aborted, its reason naming the prompt and where the answers parted. The
sampled requests give no comparable pair of their own: the evidence comes from their greedy
replays. For the two llama.cpp candidates, `llama-perplexity --kl-divergence` measures the same
pair on a text of its own, and both figures are printed side by side (`-s` shows them).

Needs `LLAMA_TOOLS_DIR` (llama-quantize, llama-perplexity: `deploy/engines/llama-server.sh
--tools`) besides the engines of test_real_engines.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from test_real_engines import (  # noqa: F401 - the fixtures are used by name
    DETERMINISTIC_LLAMA,
    REQUEST_TIMEOUT_S,
    Engines,
    Proc,
    engines,
    free_port,
    http_client,
    identities_settled,
    poll,
    required_path,
    run_switchyard,
    start_switchyard,
)

#: Thirty-two prompts of the kinds agents and people send: facts, lists, code, arithmetic,
#: instructions, rewriting. Even ones are sent greedy, odd ones sampled (temperature 0.7).
PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Name three primary colors.",
    "Write a Python function that returns the square of a number.",
    "What is 12 times 7?",
    "Give me a synonym for happy.",
    "Explain what a CPU does in one sentence.",
    "List the days of the week.",
    "Translate 'good morning' into Spanish.",
    "What is the boiling point of water in Celsius?",
    "Write a haiku about the sea.",
    "What does HTTP stand for?",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "What is the largest planet in the solar system?",
    "Write a shell command that lists files in a directory.",
    "Name two programming languages.",
    "What is the opposite of cold?",
    "How many legs does a spider have?",
    "Write a SQL query that selects all rows from a table named users.",
    "What color is the sky on a clear day?",
    "Give one tip for staying healthy.",
    "What is the chemical symbol for gold?",
    "Complete the sentence: The quick brown fox",
    "What is 100 divided by 4?",
    "Name a fruit that is yellow.",
    "What is the first letter of the English alphabet?",
    "Write a JavaScript line that prints hello to the console.",
    "Who wrote Hamlet?",
    "What is the freezing point of water in Fahrenheit?",
    "Describe a cat in five words.",
    "What is the square root of 81?",
    "Name the four seasons.",
    "Rewrite this sentence politely: give me the report.",
]
MAX_TOKENS = 24
#: The plan's rule. A near tie: both sides within a factor of e (1 nat) between the two tokens.
#: The bounds sit between what the same weights requantized or converted measure here (same top
#: at least ~0.9 of compared positions, mean KL at most ~0.02) and what a Q2_K requantization
#: measures (docs/shadow.md, "Replays and the equivalence rule").
RULE = "{ near_tie_logprob = 1.0, min_same_top = 0.85, max_mean_kl = 0.1 }"


def tools() -> Path:
    return required_path("LLAMA_TOOLS_DIR")


@pytest.fixture(scope="module")
def requantized(engines: Engines, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bundled Q4_1 GGUF requantized to Q8_0 and Q2_K (a second each)."""
    out = tmp_path_factory.mktemp("requantized")
    made = {}
    for kind in ("Q8_0", "Q2_K"):
        target = out / f"smollm2-{kind}.gguf"
        done = subprocess.run(
            [str(tools() / "llama-quantize"), "--allow-requantize", str(engines.gguf), str(target), kind],
            capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        made[kind] = target
    return made


def kl_divergence(base: Path, other: Path, workdir: Path) -> dict[str, float]:
    """`llama-perplexity --kl-divergence` of `other` against `base`, on a fixed 6 KB of English
    (tests/prompts/kl-divergence.txt: the README's first 6 KB when the figures in docs/shadow.md
    were measured)."""
    text = Path(__file__).resolve().parents[1] / "prompts" / "kl-divergence.txt"
    logits = workdir / f"{base.stem}.kld"
    perplexity = str(tools() / "llama-perplexity")
    if not logits.exists():
        done = subprocess.run([perplexity, "-m", str(base), "-f", str(text), "-c", "128", "--kl-divergence-base", str(logits)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    done = subprocess.run([perplexity, "-m", str(other), "-f", str(text), "-c", "128", "--kl-divergence-base", str(logits),
                           "--kl-divergence"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    kld = re.search(r"Mean\s+KLD:\s+([0-9.]+)", out)
    same = re.search(r"Same top p:\s+([0-9.]+)", out)
    assert kld and same, out[-3000:]
    return {"mean_kl": float(kld.group(1)), "same_top": float(same.group(1)) / 100.0}


def llama_server(bin_path: Path, gguf: Path, workdir: Path, name: str) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc(name, [str(bin_path), "-m", str(gguf), "-c", "2048", "--host", "127.0.0.1", "--port", str(port),
                       *DETERMINISTIC_LLAMA], workdir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    with http_client(timeout=5.0) as http:
        poll(name, lambda: http.get(f"{url}/health").status_code == 200, proc)
    return proc, url


def release_config(engines: Engines, primary_url: str, candidate: str, db: Path, admin: str) -> str:
    return f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[ledger]
path = "{db}"

[admin]
listen = "{admin}"

[backends.primary]
engine = "llama.cpp"
url = "{primary_url}"
artifact = "{engines.gguf}"
binary = "{engines.llama_bin}"
require_verified_identity = true
{candidate}
[models.smollm2]
primary = "primary"

[plans.evidence]
evaluate_every_ms = 200
# This test judges answers. mlx_lm.server on this CPU is an order of magnitude slower than
# llama-server (the release's speed verdict says so, surely above critical), which would end the
# MLX release before its evidence is in.
performance = {{ allowed = 1000.0, critical = 10000.0 }}
replay = {{ max_tokens = {MAX_TOKENS}, tokens_per_hour = 10000000 }}
equivalence = {RULE}
steps = [{{ step = "shadow", min_pairs = 30 }}, {{ step = "promote" }}]
"""


def run_release(config: str, workdir: Path) -> tuple[dict, list[tuple]]:
    """Starts the release, sends every prompt once (waiting for each one's evidence), and
    returns the release as it ended and its comparisons (verdict, mode, reason, judgement)."""
    import sqlite3

    db = Path(re.search(r'path = "([^"]+)"', config).group(1))
    admin = re.search(r'\[admin\]\nlisten = "([^"]+)"', config).group(1)

    with start_switchyard(workdir, config, identities_settled("primary", "cand")) as p, http_client(timeout=10.0) as http:
        started = http.post(f"http://{admin}/admin/releases", json={"model": "smollm2", "candidate": "cand", "plan": "evidence"})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]

        def release() -> dict:
            return http.get(f"http://{admin}/admin/releases/{rid}").json()["release"]

        def decided():  # noqa: ANN202
            r = release()
            return r if r["state"] in ("aborted", "completed") else None

        def settled() -> float:
            """Requests whose evidence is in: a pair judged, or a replay that yielded."""
            text = http.get(f"{p.url}/metrics").text
            total = 0.0
            for line in text.splitlines():
                if line.startswith("switchyard_shadow_comparisons_total{") and 'verdict="incomparable"' not in line:
                    total += float(line.rsplit(" ", 1)[1])
                if line.startswith("switchyard_shadow_replays_total{") and 'outcome="busy"' in line:
                    total += float(line.rsplit(" ", 1)[1])
            return total

        client = p.client()
        for sent, prompt in enumerate(PROMPTS, start=1):
            if decided():
                break
            sampling = {"temperature": 0} if sent % 2 else {"temperature": 0.7}
            client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS, **sampling
            )
            poll("the request's evidence", lambda n=sent: settled() >= n or decided(), p.proc, timeout=REQUEST_TIMEOUT_S)
        verdict = poll("the release's verdict", decided, p.proc, timeout=REQUEST_TIMEOUT_S)
        evaluations = http.get(f"http://{admin}/admin/releases/{rid}").json()
    rows = sqlite3.connect(db).execute(
        "SELECT verdict, mode, reason, equivalence FROM comparisons ORDER BY id"
    ).fetchall()
    # Every stored verdict comes out the same when counted again from the ledger.
    explained = run_switchyard("release", "explain", rid, "--recompute", "--ledger", str(db))
    assert " 0 verdict(s) disagree" in explained, explained
    return {**verdict, "evaluations": evaluations}, rows


def figures(rows: list[tuple]) -> dict:
    """Same-top share and mean KL over the pairs judged token by token, and pairs by verdict."""
    judged = [json.loads(r[3]) for r in rows if r[3]]
    positions = sum(j["positions"] for j in judged)
    return {
        "pairs": {v: sum(1 for r in rows if r[0] == v) for v in ("match", "equivalent", "mismatch", "incomparable")},
        "replays": sum(1 for r in rows if r[1] == "replay"),
        "judged": len(judged),
        "positions": positions,
        "same_top": sum(j["same_top"] for j in judged) / positions if positions else None,
        "mean_kl": sum(j["kl_sum"] for j in judged) / positions if positions else None,
    }


def candidate_llama(engines: Engines, url: str, gguf: Path) -> str:
    return f"""
[backends.cand]
engine = "llama.cpp"
url = "{url}"
artifact = "{gguf}"
binary = "{engines.llama_bin}"
require_verified_identity = true
"""


@pytest.mark.parametrize("kind", ["Q8_0", "Q2_K"])
def test_a_requantized_candidate_is_judged_by_the_equivalence_rule(
    engines: Engines, requantized: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    gguf = requantized[kind]
    primary, primary_url = llama_server(engines.llama_bin, engines.gguf, tmp_path, "primary")
    candidate, candidate_url = llama_server(engines.llama_bin, gguf, tmp_path, f"candidate-{kind}")
    try:
        config = release_config(engines, primary_url, candidate_llama(engines, candidate_url, gguf),
                                tmp_path / "ledger.db", f"127.0.0.1:{free_port()}")
        verdict, rows = run_release(config, tmp_path)
    finally:
        primary.stop()
        candidate.stop()
    measured = figures(rows)
    reference = kl_divergence(engines.gguf, gguf, tmp_path)
    print(f"\n{kind} against Q4_1: release {verdict['state']} ({verdict['waiting_for']}); replayed pairs "
          f"{measured}; llama-perplexity --kl-divergence {reference}")
    tokens = verdict["evaluations"]["token_evidence"]
    print(f"the release's pairs judged token by token: {tokens['aggregate']}")
    # The release's page counts the ledger's judged pairs (a replay still running when the page
    # was read lands after it), and shows where answers parted.
    assert tokens["rule"] is not None and 1 <= tokens["aggregate"]["pairs"] <= measured["judged"], (tokens, measured)
    assert tokens["aggregate"]["positions"] <= measured["positions"], (tokens, measured)
    assert all(d["divergence"] is not None for d in tokens["divergences"]), tokens
    if kind == "Q8_0":
        # Every sampled request was replayed (and greedy ones that differed); all held.
        assert measured["replays"] >= 16, measured
        assert verdict["state"] == "completed", verdict
        assert measured["pairs"]["mismatch"] == 0, rows
        # Judged equivalent, not merely never different: some replayed pairs parted, at near ties.
        assert measured["pairs"]["equivalent"] >= 1, measured
        assert reference["mean_kl"] < 0.1
    else:
        # Aborted on the first pair that parted at a confident choice.
        assert verdict["state"] == "aborted", verdict
        reason = verdict["waiting_for"]
        assert "comparable pairs differ; first: request " in reason and "(replay): prompt " in reason, reason
        # The reason names the prompt, and the confident divergence that decided it.
        assert any(f'prompt "{prompt[:24]}' in reason for prompt in PROMPTS), reason
        assert "confident divergence at token" in reason, reason
        assert tokens["aggregate"]["different"] >= 1 and tokens["divergences"][0]["verdict"] == "mismatch", tokens
        assert reference["mean_kl"] > 0.1


def test_the_mlx_conversion_is_judged_equivalent_and_promoted(engines: Engines, tmp_path: Path) -> None:
    primary, primary_url = llama_server(engines.llama_bin, engines.gguf, tmp_path, "primary")
    try:
        candidate = f"""
[backends.cand]
engine = "mlx"
url = "{engines.mlx_url}"
artifact = "{engines.mlx_dir}"
require_verified_identity = true
"""
        config = release_config(engines, primary_url, candidate, tmp_path / "ledger.db", f"127.0.0.1:{free_port()}")
        verdict, rows = run_release(config, tmp_path)
    finally:
        primary.stop()
    measured = figures(rows)
    print(f"\nMLX conversion against Q4_1: release {verdict['state']}; replayed pairs {measured} "
          "(llama-perplexity cannot run the MLX weights)")
    assert measured["replays"] >= 16, measured
    assert verdict["state"] == "completed", (verdict, rows)
    # Promoted on pairs judged equivalent (the two engines' arithmetic parts at near ties), none
    # different.
    assert measured["pairs"]["equivalent"] >= 1 and measured["pairs"]["mismatch"] == 0, measured
