"""Pools on the REAL llama-server: two replicas of the bundled GGUF, each started with its
defaults (so each keeps its own prompt cache), behind one model through `[pools]`.

- Agent-like conversations resend their whole history every turn: each later turn goes back to
  the replica that served the turn before (`x-switchyard-placement: affinity`), whose engine
  reports most of the prompt cached (`server-timing`'s `cache` entry, the ledger's
  `cached_tokens`, `switchyard_prompt_cache_hit_ratio`).
- A replica killed with `kill -9` while it streams: that stream ends with an error event, every
  new request is served by the other replica without a client error, and the killed one is
  back in the pool once it runs again.
- The same under an agent-like load (eight conversations streaming turn after turn): the
  streams under way on the killed replica end with an error, every request sent after the kill
  is served whole by the other, and the killed replica comes back once restarted.
- A canary release from one pool of two replicas to another, driven by the `openai` SDK: each
  session on one side and, within it, on one replica; promoted on the pairs and requests of
  every member; every verdict recomputed the same from the ledger.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

from conftest import Proc, StartupError, http_client
from test_real_engines import (
    REQUEST_TIMEOUT_S,
    free_port,
    identities_settled,
    poll,
    required_path,
    run_switchyard,
    start_switchyard,
)

#: A system prompt of about 600 tokens, the same in every conversation (an agent's own
#: instructions), so each turn's prompt is long enough for its cached share to matter.
SYSTEM = (Path(__file__).resolve().parents[1] / "prompts" / "kl-divergence.txt").read_text()[:2400]


def replica(name: str, port: int, workdir: Path) -> Proc:
    """A llama-server of the bundled model on `port`, with one thread, as tests/bench/pools runs
    them: replicas share this machine's two cores, and llama.cpp's threads wait for each other
    by spinning, so two replicas of two threads each on two cores slowed each other down by a
    factor of ten or more at times (a first turn over two minutes), where replicas on machines
    of their own would not."""
    argv = [str(required_path("LLAMA_SERVER_BIN")), "-m", str(required_path("SMOLLM2_GGUF")),
            "-c", "8192", "--threads", "1", "--host", "127.0.0.1", "--port", str(port)]
    proc = Proc(name, argv, workdir / f"{name}.log")
    with http_client(timeout=5.0) as http:
        poll(name, lambda: http.get(f"http://127.0.0.1:{port}/health").status_code == 200, proc)
    return proc


@contextlib.contextmanager
def pooled(
    workdir: Path, pool: str = "", pools: dict[str, list[str]] | None = None, extra: str = ""
) -> Iterator[tuple[dict, str, Path]]:
    """Replicas pooled as `pools` (`llama`: `a` and `b` by default; the first pool serves
    `smollm2`, each pool's section ends with `pool`), then `extra`; Switchyard in front with a
    ledger: yields the replicas (name to [proc, port]), Switchyard's URL and the ledger's path."""
    pools = pools or {"llama": ["a", "b"]}
    ports = {name: free_port() for members in pools.values() for name in members}
    procs = {}
    db = workdir / "ledger.db"
    try:
        for name, port in ports.items():
            procs[name] = [replica(f"llama-{name}", port, workdir), port]
        backends = "".join(
            f"""
[backends.{name}]
engine = "llama.cpp"
url = "http://127.0.0.1:{port}"
artifact = "{required_path('SMOLLM2_GGUF')}"
binary = "{required_path('LLAMA_SERVER_BIN')}"
"""
            for name, port in ports.items()
        )
        sections = "".join(f"\n[pools.{name}]\nmembers = {json.dumps(members)}\n{pool}\n" for name, members in pools.items())
        config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[ledger]
path = "{db}"
{backends}
{sections}
[models.smollm2]
primary = "{next(iter(pools))}"
{extra}
"""
        with start_switchyard(workdir, config, identities_settled(*ports)) as p:
            yield procs, p.url, db
    finally:
        for proc, _ in procs.values():
            proc.stop()


def history(name: str, turns: int) -> list[dict]:
    """A conversation after `turns` turns: the system prompt, then a question per turn, each
    after the answer to the one before (fixed, as an agent resends what it was answered)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{name}: what is a prompt cache?"}]
    for t in range(2, turns + 1):
        messages.append({"role": "assistant", "content": f"Answer {t - 1} of conversation {name}."})
        messages.append({"role": "user", "content": f"{name}: and question {t}?"})
    return messages


def send(url: str, name: str, turns: int) -> httpx.Response:
    with http_client(timeout=REQUEST_TIMEOUT_S) as http:
        r = http.post(f"{url}/v1/chat/completions", json={
            "model": "smollm2", "messages": history(name, turns), "temperature": 0.7, "max_tokens": 8})
    assert r.status_code == 200, r.text
    return r


def cache_entry(r: httpx.Response) -> tuple[int, int]:
    m = re.search(r'cache;desc="(\d+) of (\d+) tok"', r.headers["server-timing"])
    assert m, r.headers["server-timing"]
    return int(m.group(1)), int(m.group(2))


def test_each_conversation_keeps_its_replica_and_its_prompt_cache(tmp_path: Path) -> None:
    names = ["c1", "c2", "c3", "c4"]
    with pooled(tmp_path) as (_, url, db):
        # The first turns at once: each replica takes some (the less loaded of the two).
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            first = dict(zip(names, pool.map(lambda n: send(url, n, 1), names)))
        home = {n: r.headers["x-switchyard-backend"] for n, r in first.items()}
        assert set(home.values()) == {"a", "b"}, home
        for r in first.values():
            assert r.headers["x-switchyard-pool"] == "llama"
            assert r.headers["x-switchyard-placement"] in ("load", "only"), r.headers
        for turns in range(2, 5):
            for n in names:
                r = send(url, n, turns)
                assert r.headers["x-switchyard-backend"] == home[n], (n, turns, r.headers)
                assert r.headers["x-switchyard-placement"] == "affinity", (n, turns, r.headers)
                cached, prompt = cache_entry(r)
                # The replica still holds the turn before, the long system prompt included.
                assert cached >= 500 and cached / prompt > 0.8, (n, turns, cached, prompt)
        with http_client(timeout=5.0) as http:
            metrics = http.get(f"{url}/metrics").text
            readyz = http.get(f"{url}/readyz").json()
    for member in ("a", "b"):
        ratio = re.search(rf'switchyard_prompt_cache_hit_ratio{{backend="{member}"}} (\S+)', metrics)
        assert ratio and float(ratio.group(1)) > 0.5, metrics
    assert [m["state"] for m in readyz["pools"]["llama"]["members"]] == ["in", "in"], readyz
    # Each request's log line names its pool and what placed it there.
    log = (tmp_path / "switchyard.log").read_text()
    assert re.search(r'backend="[ab]" pool="llama" placement="affinity"', log), log[-3000:]
    rows = sqlite3.connect(db).execute(
        "SELECT backend, pool, placement, cached_tokens FROM requests ORDER BY id").fetchall()
    assert len(rows) == 16, rows
    assert all(r[1] == "llama" for r in rows), rows
    later = rows[4:]
    assert all(r[2] == "affinity" and r[3] >= 500 for r in later), later


def test_a_replica_killed_while_it_streams(tmp_path: Path) -> None:
    with pooled(tmp_path, "eject_after = 1\neject_ms = 1000\neject_max_ms = 2000") as (procs, url, _):
        # A conversation on `a`, found by starting new ones until one lands there.
        name = next(n for n in (f"k{i}" for i in range(40)) if send(url, n, 1).headers["x-switchyard-backend"] == "a")
        with http_client(timeout=REQUEST_TIMEOUT_S) as http, http.stream(
            "POST", f"{url}/v1/chat/completions",
            json={"model": "smollm2", "messages": history(name, 2), "max_tokens": 400, "stream": True},
        ) as stream:
            assert stream.headers["x-switchyard-backend"] == "a"
            lines = stream.iter_lines()
            for line in lines:
                if line.startswith("data: {"):
                    break  # the first token is out: the engine is mid-answer
            procs["a"][0].popen.kill()
            rest = "\n".join(lines)
        # The stream ends with an error event, not as a finished answer.
        assert "data: [DONE]" not in rest and '"error"' in rest, rest[-2000:]
        # Every new request is served, by `b`, whatever its conversation's replica was.
        for n in [name, "after-1", "after-2", "after-3"]:
            r = send(url, n, 3)
            assert r.headers["x-switchyard-backend"] == "b", r.headers
        # `a` runs again on its port: the probes see it, its backoff ends, and it serves again.
        procs["a"][0] = replica("llama-a-again", procs["a"][1], tmp_path)
        with http_client(timeout=5.0) as http:
            def back() -> bool:
                readyz = http.get(f"{url}/readyz").json()
                members = {m["backend"]: m["state"] for m in readyz["pools"]["llama"]["members"]}
                return members["a"] == "in" and readyz["backends"]["a"]["state"] == "ready"
            poll("the killed replica back in the pool", back, procs["a"][0])
        served = {send(url, f"again-{i}", 1).headers["x-switchyard-backend"] for i in range(40)}
        assert "a" in served, served


class Load:
    """Conversations streamed turn after turn, each by a thread of its own, until `stop`: every
    request's start (monotonic), replica, status and how its stream ended."""

    def __init__(self, url: str, conversations: int) -> None:
        self.url, self.stop = url, threading.Event()
        self.lock = threading.Lock()
        self.done: list[dict] = []
        self.streaming: dict[str, str] = {}  # conversation -> the replica streaming its turn now
        self.threads = [threading.Thread(target=self.converse, args=(f"load-{i}",)) for i in range(conversations)]
        for t in self.threads:
            t.start()

    def converse(self, name: str) -> None:
        with http_client(timeout=REQUEST_TIMEOUT_S) as http:
            turn = 0
            while not self.stop.is_set():
                turn += 1
                started, outcome = time.monotonic(), {"conversation": name}
                try:
                    with http.stream("POST", f"{self.url}/v1/chat/completions", json={
                        "model": "smollm2", "messages": history(name, turn), "max_tokens": 48,
                        "temperature": 0.7, "stream": True,
                    }) as r:
                        outcome.update(status=r.status_code, backend=r.headers.get("x-switchyard-backend"))
                        body = []
                        for line in r.iter_lines():
                            body.append(line)
                            if line.startswith("data: {") and name not in self.streaming:
                                with self.lock:
                                    self.streaming[name] = outcome["backend"]
                        text = "\n".join(body)
                        outcome.update(whole="data: [DONE]" in text, error='"error"' in text, tail=text[-400:])
                except httpx.HTTPError as e:
                    outcome.update(status=None, whole=False, error=True, tail=repr(e))
                with self.lock:
                    self.streaming.pop(name, None)
                    self.done.append({**outcome, "started": started})

    def on(self, backend: str) -> bool:
        with self.lock:
            return backend in self.streaming.values()

    def since(self, at: float) -> list[dict]:
        with self.lock:
            return [d for d in self.done if d["started"] > at]

    def end(self) -> list[dict]:
        self.stop.set()
        for t in self.threads:
            t.join()
        return self.done


def test_a_replica_killed_under_load(tmp_path: Path) -> None:
    with pooled(tmp_path, "eject_after = 1\neject_ms = 1000\neject_max_ms = 2000") as (procs, url, _):
        load = Load(url, 8)
        try:
            try:
                poll("a stream under way on a", lambda: len(load.done) >= 8 and load.on("a"), procs["a"][0])
            except StartupError as e:
                with http_client(timeout=5.0) as http:
                    readyz = http.get(f"{url}/readyz").json()
                served = {b: sum(d.get("backend") == b for d in load.done) for b in ("a", "b", None)}
                raise AssertionError(f"no stream on a; answers by replica {served}; /readyz {readyz}") from e
            procs["a"][0].popen.kill()
            killed = time.monotonic()
            # Every conversation sends two turns after the kill.
            poll("two turns of each conversation after the kill",
                 lambda: all(sum(d["conversation"] == f"load-{i}" for d in load.since(killed)) >= 2 for i in range(8)),
                 procs["b"][0], timeout=REQUEST_TIMEOUT_S)
            with http_client(timeout=5.0) as http:
                readyz = http.get(f"{url}/readyz").json()
            out = {m["backend"]: m["state"] for m in readyz["pools"]["llama"]["members"]}
            assert out["a"] == "ejected" or readyz["backends"]["a"]["state"] != "ready", readyz
            procs["a"][0] = replica("llama-a-again", procs["a"][1], tmp_path)
            with http_client(timeout=5.0) as http:
                def back() -> bool:
                    readyz = http.get(f"{url}/readyz").json()
                    members = {m["backend"]: m["state"] for m in readyz["pools"]["llama"]["members"]}
                    return members["a"] == "in" and readyz["backends"]["a"]["state"] == "ready"
                poll("the killed replica back in the pool", back, procs["a"][0])
            restarted = time.monotonic()
            # New conversations spread over both replicas again.
            poll("a request served by the restarted replica",
                 lambda: any(d["backend"] == "a" and d["whole"] for d in load.since(restarted)) or
                 send(url, f"new-{time.monotonic()}", 1).headers["x-switchyard-backend"] == "a",
                 procs["a"][0], timeout=REQUEST_TIMEOUT_S)
        finally:
            done = load.end()
    before = [d for d in done if d["started"] < killed]
    after = [d for d in done if killed < d["started"] < restarted]
    # What was under way on `a` ended with an error, never as a finished answer; on `b` it finished.
    cut = [d for d in before if d["backend"] == "a" and not d["whole"]]
    assert cut and all(d["error"] for d in cut), cut
    assert all(d["whole"] and d["status"] == 200 for d in before if d["backend"] == "b"), before
    # Everything sent after the kill was served whole by `b`: no client saw an error.
    assert len(after) >= 16 and all(d["status"] == 200 and d["whole"] and d["backend"] == "b" for d in after), [
        d for d in after if not (d["status"] == 200 and d["whole"] and d["backend"] == "b")]
    print(f"\nkill -9 under load: {len(before)} requests before, {len(cut)} cut on a, {len(after)} after, all on b")


#: An admin listener (its port filled in) and a quick plan: copies compared in a shadow step, half
#: the sessions on the candidate, then promotion. Speed is not under test: four replicas share
#: two cores, and which one is slower is chance. Nor is the comparator: two replicas of one model
#: can part at a near tie even at temperature 0, since llama.cpp's arithmetic depends on which
#: requests it batches together, and two sessions run at a time here — so the plan accepts a
#: minority of differing pairs (the equivalence rule is what tells a near tie from a difference;
#: test_equivalence.py).
RELEASE = """
[admin]
listen = "{admin}"

[plans.pools]
evaluate_every_ms = 200
performance = {{ allowed = 1000.0, critical = 10000.0 }}
tolerance = {{ max_mismatch_share = 0.5 }}
steps = [
    {{ step = "shadow", min_pairs = 4 }},
    {{ step = "live", weight = 50, min_requests = 4 }},
    {{ step = "promote", bake_s = 0 }},
]
"""


def test_a_release_from_one_pool_of_replicas_to_another(tmp_path: Path) -> None:
    admin = f"127.0.0.1:{free_port()}"
    pools = {"now": ["a", "b"], "next": ["c", "d"]}
    with pooled(tmp_path, pools=pools, extra=RELEASE.format(admin=admin)) as (_, url, db), http_client(timeout=10.0) as http:
        started = http.post(f"http://{admin}/admin/releases", json={"model": "smollm2", "candidate": "next", "plan": "pools"})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]

        def release() -> dict:
            return http.get(f"http://{admin}/admin/releases/{rid}").json()["release"]

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S,
                               http_client=openai.DefaultHttpxClient(trust_env=False))

        def turn(name: str, turns: int) -> tuple[str, str, str]:
            """One turn of session `name` by the SDK: where it was served (variant, pool, replica)."""
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=history(name, turns)[1:], max_tokens=8, temperature=0,
                extra_headers={"x-session-id": name})
            assert raw.parse().choices[0].message.content is not None
            return raw.headers["x-switchyard-variant"], raw.headers["x-switchyard-pool"], raw.headers["x-switchyard-backend"]

        def session(name: str) -> tuple[str, list[tuple[str, str, str]]]:
            return name, [turn(name, t) for t in range(1, 4)]

        # Sessions of three turns, two at a time, until the release is promoted.
        sessions: dict[str, list[tuple[str, str, str]]] = {}
        deadline = time.monotonic() + 600
        with concurrent.futures.ThreadPoolExecutor(2) as runner:
            while (state := release())["state"] != "completed":
                assert state["state"] == "running", state
                assert time.monotonic() < deadline, state
                n = len(sessions)
                sessions.update(runner.map(session, [f"s{n}", f"s{n + 1}"]))

        # A session only moves forward (primary pool, then the candidate's), one replica per pool.
        for name, seen in sessions.items():
            moved, member = False, {}
            for variant, pool, backend in seen:
                if pool == "now":
                    assert variant == "primary" and not moved, seen
                else:
                    assert pool == "next" and variant in ("canary", "primary"), seen
                    moved = True
                assert backend in pools[pool], seen
                assert member.setdefault(pool, backend) == backend, f"{name} changed replica: {seen}"
        assert sum(any(v == "canary" for v, _, _ in seen) for seen in sessions.values()) >= 2, sessions

        # Promoted: the candidate pool serves, on both its replicas.
        served = set()
        for i in range(40):
            variant, pool, backend = turn(f"after-{i}", 1)
            assert (variant, pool) == ("primary", "next")
            served.add(backend)
            if served == {"c", "d"}:
                break
        assert served == {"c", "d"}, served
        evaluations = http.get(f"http://{admin}/admin/releases/{rid}").json()["evaluations"]
    advanced = [e for e in evaluations if e["decision"] == "advance"]
    shadowed = advanced[0]["evidence"]
    assert shadowed["comparable_pairs"] >= 4 and 2 * shadowed["mismatches"] < shadowed["comparable_pairs"], shadowed
    assert advanced[1]["evidence"]["candidate_requests"] >= 4, advanced[1]
    # Each side's rows name its pool; the copies went to the other side's replicas.
    with contextlib.closing(sqlite3.connect(db)) as conn:
        arms = set(conn.execute("SELECT arm, pool FROM requests WHERE variant IN ('primary', 'canary') AND arm IS NOT NULL"))
        pairs = set(conn.execute("SELECT primary_backend, candidate_backend FROM comparisons WHERE candidate_backend IS NOT NULL"))
    assert arms <= {("primary", "now"), ("candidate", "next")} and ("candidate", "next") in arms, arms
    assert pairs and all({p, c} & {"a", "b"} and {p, c} & {"c", "d"} for p, c in pairs), pairs
    explained = run_switchyard("release", "explain", rid, "--recompute", "--ledger", str(db))
    assert " 0 verdict(s) disagree" in explained, explained
    print(f"\nrelease now -> next: {len(sessions)} sessions, pairs between {sorted(pairs)}, "
          f"shadow step {advanced[0]['evidence']['comparable_pairs']} pairs, live step "
          f"{advanced[1]['evidence']['candidate_requests']} candidate requests")
