"""The dashboard in a browser.

Against the fake engine: a running release is aborted from the page, which asks for a reason,
then shows weight 0 and the decision with its reason; the release's log shows its transitions
until every evaluation is asked for; the ledger records the abort with the admin token's name. A
shadow that answers otherwise shows as a mismatch, the two outputs side by side and no speed
ratio, and its roll-up says how many pairs differ; one judged token by token on a replay shows
where the answers parted, each side's choice and its likeliest tokens there.

Against a real managed llama-server: the model overview and the engine card show it stopped
before any request; it is loaded and unloaded from its card; `/v1/models` through the openai SDK
says `stopped`, then `ready` after a request; the CLI and the ledger have every action.

The real engines' views (both backends, the phase chart, shadow verdicts) are checked in
test_real_engines.py, which reuses that file's engines.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx

from conftest import ADDRESS, Proc, binary, child_env, http_client
from test_real_engines import free_port, poll
from ui_check import console_problems, run_check

REASON = "candidate answers look wrong in the tail"
WRONG = "Lyon is the capital."


def admin_token(tokens: Path) -> str:
    import subprocess

    done = subprocess.run(
        [str(binary("SWITCHYARD_BIN", "switchyard")), "admin", "token", "add", "ops", "--tokens", str(tokens)],
        capture_output=True, text=True, timeout=30, env=child_env(), stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_aborting_a_release_from_the_page(tmp_path: Path) -> None:
    engine_bin = str(binary("FAKE_ENGINE_BIN", "fake-engine"))
    artifact = tmp_path / "model.gguf"
    artifact.write_bytes(b"GGUF dashboard release test")
    procs: list[Proc] = []
    try:
        urls = []
        for name, build, extra in (("p", "b100-main", []), ("c", "b200-cand", []), ("w", "b300-wrong", ["--fixed-text", WRONG])):
            argv = [engine_bin, "--listen", "127.0.0.1:0", "--tokens", "6", "--model-path", str(artifact), "--build-info", build, *extra]
            proc = Proc(f"fake-{name}", argv, tmp_path / f"fake-{name}.log")
            procs.append(proc)
            urls.append(proc.wait_for_line(r"fake-engine listening on " + ADDRESS).group(1))
        tokens = tmp_path / "admin-tokens"
        token = admin_token(tokens)
        ledger = tmp_path / "ledger.db"
        admin = f"http://127.0.0.1:{free_port()}"
        config = tmp_path / "switchyard.toml"
        config.write_text(f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100

[admin]
listen = "{admin.removeprefix("http://")}"
tokens = {json.dumps(str(tokens))}

[ledger]
path = {json.dumps(str(ledger))}

[backends.p]
engine = "llama.cpp"
url = "{urls[0]}"
artifact = {json.dumps(str(artifact))}

[backends.c]
engine = "llama.cpp"
url = "{urls[1]}"
artifact = {json.dumps(str(artifact))}

[backends.w]
engine = "llama.cpp"
url = "{urls[2]}"
artifact = {json.dumps(str(artifact))}

[models.smollm2]
primary = "p"

[models.shadowed]
primary = "p"
shadow = {{ backend = "w" }}

[models.judged]
primary = "p"
shadow = {{ backend = "w", replay = {{ max_tokens = 8 }}, equivalence = {{ near_tie_logprob = 0.5 }} }}

[plans.quarter]
evaluate_every_ms = 100
steps = [{{ step = "live", weight = 25, min_requests = 100000 }}]
""")
        switchyard = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(config)], tmp_path / "switchyard.log")
        procs.append(switchyard)
        client = switchyard.wait_for_line(r"switchyard listening on " + ADDRESS).group(1)
        auth = {"authorization": f"Bearer {token}"}
        with http_client(timeout=10.0) as http:
            poll("switchyard", lambda: all(b.get("identity") == "verified" for b in http.get(f"{client}/readyz").json()["backends"].values()), switchyard, timeout=20)
            started = http.post(f"{admin}/admin/releases", headers=auth, json={"model": "smollm2", "candidate": "c", "plan": "quarter"})
            assert started.status_code == 201, started.text
            release = started.json()
            assert release["weight"] == 25 and release["state"] == "running", release
            for _ in range(2):
                answer = http.post(f"{client}/v1/chat/completions", json={"model": "shadowed", "temperature": 0, "messages": [{"role": "user", "content": "The capital of France is"}]})
                assert answer.status_code == 200, answer.text

            # A greedy request to a shadow judged token by token: its replay parts at once.
            answer = http.post(f"{client}/v1/chat/completions", json={"model": "judged", "temperature": 0, "messages": [{"role": "user", "content": "The capital of France is"}]})
            assert answer.status_code == 200, answer.text

            def pairs() -> bool:
                compared = http.get(f"{admin}/admin/comparisons?model=shadowed", headers=auth).json()
                judged = http.get(f"{admin}/admin/comparisons?model=judged", headers=auth).json()
                return sum(g["counts"]["pairs"] for g in compared["groups"]) >= 2 and len(judged["divergences"]) >= 1

            # The ledger's writer commits in batches: the page reads what it has committed.
            poll("comparisons in the ledger", pairs, switchyard, timeout=20)

            result = run_check("release", {"mode": "release", "admin": admin, "client": client, "token": token, "release": release["id"], "reason": REASON})
            assert result["page_status"] == 200
            assert result["login"]["status"] == 401 and result["login"]["opened"], result["login"]
            assert result["before"] == {"state": "running", "weight": "25%"}, result
            # Transitions only by default (the plan re-evaluates every 100 ms, holding).
            assert result["log_by_default"]["events"] >= 1 and result["log_by_default"]["evaluations"] == 0, result["log_by_default"]
            assert result["log_with_evaluations"] > 0, result
            assert "reason" in result["empty_reason_message"], result
            assert result["after"]["state"] == "aborted" and result["after"]["weight"] == "0%", result
            assert any("ops" in line and REASON in line and "aborted" in line for line in result["after"]["log"]), result["after"]
            mismatched = [g for g in result["comparisons"] if g["title"].startswith("shadowed") and any(v.startswith("mismatch") for v in g["verdicts"])]
            assert mismatched, result["comparisons"]
            for g in mismatched:
                assert g["status"] == "correctness-failed" and not g["ratios"], g
                assert len(g["side_by_side"]) == 2 and g["side_by_side"][1] == WRONG and g["side_by_side"][0] != WRONG, g
            rollup = [r for r in result["rollups"] if r["model"] == "shadowed"]
            assert len(rollup) == 1 and rollup[0]["candidate"] == "w", result["rollups"]
            pairs_shown = sum(g["counts"]["pairs"] for g in http.get(f"{admin}/admin/comparisons?model=shadowed", headers=auth).json()["groups"])
            assert rollup[0]["counts"]["mismatch"] >= 1 and rollup[0]["verdict"].endswith("differ"), rollup
            assert rollup[0]["pairs"] == pairs_shown, (rollup, pairs_shown)
            # Where the replayed pair parted: both sides' choices at token 0, their likeliest
            # tokens with logprobs, the candidate's choice marked in its own list.
            parted = [d for d in result["parted"] if "judged" in d["title"]]
            assert len(parted) == 1 and parted[0]["verdict"] == "mismatch", result["parted"]
            primary, candidate = parted[0]["sides"]
            assert (primary["side"], candidate["side"]) == ("primary", "candidate"), parted
            assert "parted at token 0" in parted[0]["title"], parted
            assert candidate["chose"].startswith('candidate chose "Lyon "'), candidate
            assert candidate["chosen"] == ['"Lyon "'], candidate
            for side in (primary, candidate):
                assert side["top"] and all(float(lp) <= 0 for _, lp in side["top"]), side
            assert console_problems(result) == [], console_problems(result)
            assert all(not e for e in result["view_errors"].values()), result["view_errors"]

            after = http.get(f"{admin}/admin/releases/{release['id']}", headers=auth).json()
            assert after["release"]["weight"] == 0 and after["release"]["state"] == "aborted", after
        rows = sqlite3.connect(ledger).execute(
            "SELECT actor, to_state, reason FROM release_events WHERE release_id = ? ORDER BY id", (release["id"],)
        ).fetchall()
        assert rows[-1] == ("ops", "aborted", REASON), rows
    finally:
        for p in reversed(procs):
            p.stop()


def test_a_managed_llama_server_stopped_loaded_and_unloaded_from_the_page(tmp_path: Path) -> None:
    """Issue 45: the true state of a managed engine everywhere, and the operator's load and
    unload buttons, against a real llama-server that Switchyard runs."""
    from openai import OpenAI

    from test_managed_engines import admin_token as managed_token
    from test_managed_engines import llama_backend, managed_switchyard
    from test_real_engines import poll

    token = managed_token(tmp_path)
    ledger = tmp_path / "ledger.db"
    with managed_switchyard(tmp_path, llama_backend(), "llama", token=token, ledger=ledger) as s:
        client = OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)

        def listed() -> dict:
            models = client.models.list().data
            assert [m.id for m in models] == ["smollm2"], models
            return models[0].to_dict()

        before = listed()
        assert before["state"] == "stopped" and before["backend"] == "llama", before
        poll("readiness", lambda: s.http.get(f"{s.url}/readyz").status_code == 200, s.proc, timeout=120)

        result = run_check("managed", {"mode": "managed", "admin": s.admin, "client": s.url, "token": token, "backend": "llama"})
        assert console_problems(result) == [], console_problems(result)
        assert all(not e for e in result["view_errors"].values()), result["view_errors"]
        overview = {m["model"]: m for m in result["models"]}
        assert overview["smollm2"]["state"] == "stopped", overview
        assert overview["smollm2"]["roles"] == [{"backend": "llama", "role": "primary", "state": "stopped"}], overview
        card = {e["backend"]: e for e in result["engines_before"]}["llama"]
        # A stopped engine shows stopped, with no current load and its buttons.
        assert card["state"] == "stopped" and card["badge"] == "stopped", card
        assert "in flight" not in card["load"], card
        assert card["buttons"] == ["load", "unload", "restart"], card
        loaded = {e["backend"]: e for e in result["engines_loaded"]}["llama"]
        assert loaded["state"] == "ready" and "in flight" in loaded["load"], loaded
        assert loaded["engine"].startswith("llama.cpp/"), loaded
        unloaded = {e["backend"]: e for e in result["engines_unloaded"]}["llama"]
        assert unloaded["state"] == "stopped", unloaded
        assert "load from the browser test" in result["history"] and "unload from the browser test" in result["history"], result["history"]

        # /v1/models follows: stopped after the unload, ready after a request, with what the
        # engine reported.
        assert listed()["state"] == "stopped"
        answer = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0)
        assert answer.choices[0].message.content is not None
        after = listed()
        assert after["state"] == "ready", after
        assert after["engine"].startswith("llama.cpp/") and after["artifact"].startswith("sha256:"), after
        assert after["context_length"] == 2048, after

        # The CLI: the table with the process, and an unload with a reason.
        import subprocess

        from conftest import child_env

        def cli(*args: str) -> str:
            done = subprocess.run(
                [str(binary("SWITCHYARD_BIN", "switchyard")), "admin", "backends", *args, "--url", s.admin, "--token", token],
                capture_output=True, text=True, timeout=60, env=child_env(), stdin=subprocess.DEVNULL,
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        table = cli()
        header, row = table.splitlines()[0], next(line for line in table.splitlines() if line.startswith("llama "))
        assert "PID" in header and "STARTS" in header and "CRASHES" in header and "SWAP GROUP" in header, table
        assert str(s.backend("llama")["managed"]["pid"]) in row and "ready" in row, table
        said = subprocess.run(
            [str(binary("SWITCHYARD_BIN", "switchyard")), "admin", "backends", "unload", "llama", "--reason", "from the CLI", "--url", s.admin, "--token", token],
            capture_output=True, text=True, timeout=60, env=child_env(), stdin=subprocess.DEVNULL,
        )
        assert said.returncode == 0 and said.stdout.strip() == "unload llama: unloading (was ready)", (said.stdout, said.stderr)
        s.wait_state("llama", lambda m: m["state"] == "stopped", "the CLI's unload")
        assert listed()["state"] == "stopped"

    rows = sqlite3.connect(ledger).execute("SELECT action, actor, reason, state_before, outcome FROM engine_actions ORDER BY id").fetchall()
    assert rows == [
        ("load", "ops", "load from the browser test", "stopped", "starting"),
        ("unload", "ops", "unload from the browser test", "ready", "unloading"),
        ("unload", "ops", "from the CLI", "ready", "unloading"),
    ], rows


def test_a_pool_on_the_page(tmp_path: Path) -> None:
    """Two fake engines pooled: the overview lists both as the model's primaries, each engine card
    names the pool and the member's state in it, and the live tail says, beside each request's
    member, the pool and what placed it there. One member, restarted six times slower, is found
    degraded by the slowdown detector: its card says so, beside the baseline it is judged by."""
    engine_bin = str(binary("FAKE_ENGINE_BIN", "fake-engine"))
    artifact = tmp_path / "model.gguf"
    artifact.write_bytes(b"GGUF dashboard pool test")
    ports = {"a": free_port(), "b": free_port()}
    procs: list[Proc] = []

    def fake(name: str, token_ms: int) -> Proc:
        argv = [engine_bin, "--listen", f"127.0.0.1:{ports[name]}", "--tokens", "16", "--token-ms", str(token_ms),
                "--model-path", str(artifact), "--build-info", "b100"]
        proc = Proc(f"fake-{name}-{token_ms}", argv, tmp_path / f"fake-{name}-{token_ms}.log")
        procs.append(proc)
        proc.wait_for_line(r"fake-engine listening on " + ADDRESS)
        return proc

    try:
        engines = {name: fake(name, 2) for name in ports}
        urls = [f"http://127.0.0.1:{ports[name]}" for name in ("a", "b")]
        tokens = tmp_path / "admin-tokens"
        token = admin_token(tokens)
        admin = f"http://127.0.0.1:{free_port()}"
        config = tmp_path / "switchyard.toml"
        config.write_text(f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100

[admin]
listen = "{admin.removeprefix("http://")}"
tokens = {json.dumps(str(tokens))}

[ledger]
path = {json.dumps(str(tmp_path / "ledger.db"))}

[backends.a]
engine = "llama.cpp"
url = "{urls[0]}"
artifact = {json.dumps(str(artifact))}

[backends.b]
engine = "llama.cpp"
url = "{urls[1]}"
artifact = {json.dumps(str(artifact))}

[pools.llama]
members = ["a", "b"]

[models.smollm2]
primary = "llama"

[models.only-a]
primary = "a"

[detectors]
every_ms = 100
baseline_requests = 5
min_requests = 5
window_requests = 5
""")
        switchyard = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(config)], tmp_path / "switchyard.log")
        procs.append(switchyard)
        client = switchyard.wait_for_line(r"switchyard listening on " + ADDRESS).group(1)
        auth = {"authorization": f"Bearer {token}"}
        with http_client(timeout=10.0) as http:
            poll("switchyard", lambda: http.get(f"{client}/readyz").json()["ready"], switchyard, timeout=20)
            messages = [{"role": "user", "content": "One conversation."}]
            for turn in range(3):
                answer = http.post(f"{client}/v1/chat/completions", json={"model": "smollm2", "messages": messages})
                assert answer.status_code == 200, answer.text
                messages += [{"role": "assistant", "content": f"answer {turn}"}, {"role": "user", "content": "more"}]
            member = answer.headers["x-switchyard-backend"]

            def ask_a(n: int) -> None:
                for i in range(n):
                    r = http.post(f"{client}/v1/chat/completions", json={"model": "only-a", "messages": [{"role": "user", "content": f"question {i}"}]})
                    assert r.status_code == 200, r.text

            # `a`'s baseline (its first answer is cold), then `a` restarted six times slower.
            ask_a(11)
            poll("a clear verdict on a",
                 lambda: (http.get(f"{admin}/admin/backends", headers=auth).json()["backends"]["a"]["detectors"] or {}).get("slowdown", {}).get("verdict") == "clear",
                 switchyard, timeout=20)
            engines["a"].stop()
            engines["a"] = fake("a", 12)
            poll("a ready again", lambda: http.get(f"{client}/readyz").json()["backends"]["a"]["state"] == "ready", switchyard, timeout=20)
            ask_a(6)
            poll("a degraded", lambda: http.get(f"{client}/readyz").json()["backends"]["a"]["degraded"], switchyard, timeout=20)

            # The ledger's writer commits in batches: the page reads what it has committed.
            poll("the requests in the ledger",
                 lambda: len(http.get(f"{admin}/admin/requests?limit=10", headers=auth).json()["requests"]) >= 3, switchyard, timeout=20)
            result = run_check("pool", {"mode": "pool", "admin": admin, "client": client, "token": token})
        assert console_problems(result) == [], console_problems(result)
        assert all(not e for e in result["view_errors"].values()), result["view_errors"]
        overview = {m["model"]: m for m in result["models"]}
        assert sorted((r["backend"], r["role"]) for r in overview["smollm2"]["roles"]) == [("a", "primary"), ("b", "primary")], overview
        cards = {c["backend"]: c for c in result["pool_cards"]}
        for name in ("a", "b"):
            assert cards[name]["pool_state"] == "in" and cards[name]["pool"].startswith("llama · in · "), cards
        assert cards["a"]["degraded"].startswith("slowdown: decode rate at 0.1"), cards
        assert "5 of the latest 5 answers slow" in cards["a"]["degraded"] and cards["a"]["degraded"].endswith("(warn)"), cards
        assert cards["a"]["baseline"].startswith("<256 tokens: decode "), cards
        assert cards["b"]["degraded"] is None, cards
        # Newest first: the conversation's later turns on its member by affinity, its first by load.
        turns = [b for b in result["tail_backends"] if "llama" in b]
        assert turns[:3] == [f"{member} · llama (affinity)"] * 2 + [f"{member} · llama (load)"], result["tail_backends"]
    finally:
        for proc in reversed(procs):
            proc.stop()
