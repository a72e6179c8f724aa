"""A/A calibration of release verdicts on the REAL engines (issue 60): a release from an engine
to an identical copy of itself must pass; a worse one must not.

Two llama-servers are started the same way, with llama.cpp's DEFAULT settings (several slots,
the prompt cache and continuous batching on: that is what makes identical engines give
different greedy answers and different timings under concurrent traffic, and what the verdicts
must see through). Traffic is an agents': three client threads at once, each a run of sessions
(`x-session-id`) of two or three turns that resend the conversation with the previous answer,
varied prompts, half greedy and half sampled, some streamed, about a second of the agent's own
work between two requests (THINK_S). Each release runs a short plan (shadow, live at 50 %,
promote) and the traffic goes on until it is decided.

- A/A, the plan's defaults for correctness and speed: must be completed.
- A/A, with replays and the equivalence rule's own defaults: must be completed.
- Positive control, speed: the same llama-server behind a proxy that holds every answer 1.5 s
  must be held or aborted on speed, by the interval of its ratio.
- Positive control, correctness: a Q2_K requantization, default plan: must be aborted on
  differing pairs.

`tests/bench/aa` runs the A/A releases many times (and on mlx_lm.server) and counts the false
alarms; it uses the harness below.

Needs the engines of test_real_engines and `LLAMA_TOOLS_DIR` (llama-quantize) for the Q2_K one.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import random
import re
import sqlite3
import statistics
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from test_equivalence import PROMPTS, requantized  # noqa: F401 - the fixture is used by name
from test_real_engines import (  # noqa: F401 - the fixtures are used by name
    Engines,
    Proc,
    StartupError,
    engines,
    free_port,
    http_client,
    identities_settled,
    poll,
    run_switchyard,
    start_switchyard,
)

MAX_TOKENS = 24
#: Client threads at once, each one session after another.
CLIENTS = 3
#: What a user says after an answer, turn after turn.
FOLLOW_UPS = ["Tell me more.", "Say that again in fewer words.", "Why is that?"]
#: The longest a release may take to be decided before the run counts as undecided.
DECISION_TIMEOUT_S = 360.0
#: The agent's own work between two of its requests (a tool run, a file read), on average;
#: 0 makes a closed loop. In a closed loop of three clients the engines' host is never idle, so
#: every replay waits its full 30 s per side for it while holding the one copy slot, and the
#: shadow step starves (in such a run, 464 of 472 requests found the slot taken).
THINK_S = 1.0
#: How long the candidate behind the slow proxy holds each answer.
SLOW_DELAY_S = 1.5

STEPS = '[{ step = "shadow", min_pairs = 24 }, { step = "live", weight = 50, min_requests = 12 }, { step = "promote" }]'
#: The plans of the A/A runs: (a) the defaults for correctness and speed; (b) the same with
#: replays and the equivalence rule's own defaults.
PLANS = {
    "defaults": "",
    "replay": "replay = { max_tokens = 24, tokens_per_hour = 10000000 }\nequivalence = {}\n",
}

#: A reason that holds or ends a release for the candidate's speed or correctness (or its health):
#: in an A/A run, every one of them is a false alarm.
ALARMS = ("surely above", "comparable pairs differ", "judged token by token", "is degraded", "streams broke", "error rate")


# --- The engines --------------------------------------------------------------------------------


def default_llama(bin_path: Path, gguf: Path, workdir: Path, name: str) -> tuple[Proc, str]:
    """A llama-server with llama.cpp's defaults (slots, prompt cache, continuous batching)."""
    port = free_port()
    proc = Proc(name, [str(bin_path), "-m", str(gguf), "-c", "4096", "--host", "127.0.0.1", "--port", str(port)],
                workdir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        with http_client(timeout=5.0) as http:
            poll(name, lambda: http.get(f"{url}/health").status_code == 200, proc)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def default_mlx(python: Path, model_dir: Path, hf_home: Path, workdir: Path, name: str) -> tuple[Proc, str]:
    """An mlx_lm.server with its defaults, started as test_real_engines starts it."""
    port = free_port()
    proc = Proc(name, ["env", f"HF_HOME={hf_home}", "HF_HUB_OFFLINE=1", str(python), "-m", "mlx_lm", "server",
                       "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)], workdir / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    try:
        with http_client(timeout=5.0) as http:
            poll(name, lambda: http.get(f"{url}/v1/models").status_code == 200, proc)
    except BaseException:
        proc.stop()
        raise
    return proc, url


def llama_backend(name: str, url: str, bin_path: Path, gguf: Path) -> str:
    return f"""
[backends.{name}]
engine = "llama.cpp"
url = "{url}"
artifact = "{gguf}"
binary = "{bin_path}"
require_verified_identity = true
"""


def mlx_backend(name: str, url: str, model_dir: Path) -> str:
    return f"""
[backends.{name}]
engine = "mlx"
url = "{url}"
artifact = "{model_dir}"
require_verified_identity = true
"""


# --- A candidate that is really slower ------------------------------------------------------------

#: Headers of one connection, not forwarded.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host",
              "content-length"}


@contextlib.contextmanager
def slow_proxy(upstream: str, delay_s: float) -> Iterator[str]:
    """An HTTP proxy in front of `upstream` that holds each answer to a POST `delay_s` before
    returning it (whole: a stream too arrives at once, late). GETs (`/health`, `/props`,
    `/v1/models`, `/slots`: the identity probes) pass without delay."""
    target = urllib.parse.urlsplit(upstream)

    class Forward(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _body(self) -> bytes | None:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else None

        def _forward(self) -> None:
            body = self._body()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=300)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                status, reason, answer_headers = answer.status, answer.reason, answer.getheaders()
            except OSError as e:
                data = json.dumps({"error": {"message": f"slow proxy: {e}"}}).encode()
                status, reason, answer_headers = 502, "Bad Gateway", [("content-type", "application/json")]
            finally:
                conn.close()
            if self.command == "POST":
                time.sleep(delay_s)  # the candidate's slowness itself
            self.send_response(status, reason)
            for k, v in answer_headers:
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _forward

        def log_message(self, format: str, *args) -> None:  # noqa: A002, ANN002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="slow-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --- Traffic like agents' ------------------------------------------------------------------------


class Traffic:
    """CLIENTS threads, each a run of sessions of two or three turns; every turn resends the
    conversation with the previous answer. Half the sessions greedy, half sampled at 0.7; one
    turn in three streamed. Runs until stopped."""

    def __init__(self, client_factory, tag: str, max_tokens: int = MAX_TOKENS, think_s: float = THINK_S) -> None:  # noqa: ANN001
        self.client_factory = client_factory
        self.tag = tag
        self.max_tokens = max_tokens
        self.think_s = think_s
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.served: Counter[str] = Counter()
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"client-{i}", daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> Traffic:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=180)

    def _run(self, thread: int) -> None:
        client = self.client_factory()
        self.random = random.Random(f"{self.tag}-{thread}")
        n = 0
        while not self.stopping.is_set():
            try:
                self._session(client, thread, n)
            except Exception as e:  # noqa: BLE001 - recorded, and the test fails on it
                with self.lock:
                    self.errors.append(f"client {thread}, session {n}: {e!r}")
                    if len(self.errors) >= 5:
                        return
            n += 1

    def _session(self, client, thread: int, n: int) -> None:  # noqa: ANN001
        k = thread + CLIENTS * n
        sampling = {"temperature": 0} if k % 2 == 0 else {"temperature": 0.7}
        session = f"{self.tag}-{thread}-{n}"
        messages = [{"role": "user", "content": PROMPTS[(7 * k) % len(PROMPTS)]}]
        for turn in range(2 + k % 2):
            if self.stopping.is_set():
                return
            stream = (k + turn) % 3 == 0
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=messages, max_tokens=self.max_tokens, stream=stream,
                extra_headers={"x-session-id": session}, **sampling,
            )
            parsed = raw.parse()
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
            else:
                text = parsed.choices[0].message.content or ""
            with self.lock:
                self.sent += 1
                self.served[raw.headers.get("x-switchyard-backend", "?")] += 1
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": FOLLOW_UPS[(k + turn) % len(FOLLOW_UPS)]}]
            self.think()

    def think(self) -> None:
        """The agent's own work between two requests (a tool run, a file read): 0.5 to 1.5 times
        think_s, over early when the traffic stops."""
        if self.think_s > 0:
            self.stopping.wait(self.think_s * self.random.uniform(0.5, 1.5))


# --- One release ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    label: str
    release: dict
    evaluations: list[dict]
    seconds: float
    sent: int
    served: dict
    errors: list[str]
    comparisons: dict = field(default_factory=dict)
    #: The warm pairs of the same work (match, equivalent), from the ledger: how many, how many
    #: under the same contention on both sides, and the median total-time ratio of each kind.
    timed: dict = field(default_factory=dict)
    explained: str = ""
    decided: bool = True

    @property
    def state(self) -> str:
        return self.release["state"]

    @property
    def reason(self) -> str:
        return self.release.get("waiting_for") or ""

    def alarms(self) -> list[str]:
        """Every evaluation that held or ended the release on the candidate's speed, correctness
        or health, in order."""
        return [
            f"{e['decision']} at step {e['step']}: {e['reason']}"
            for e in self.evaluations
            if e["decision"] != "advance" and any(a in (e["reason"] or "") for a in ALARMS)
        ]

    def verdict(self) -> str:
        """completed (no alarm on the way), held (the release waits on an alarm, or one held it
        on the way), aborted, or undecided (nothing decided within the timeout)."""
        if self.state == "aborted":
            return "aborted"
        if self.state == "held" or self.alarms():
            return "held"
        if self.state == "completed":
            return "completed"
        return "undecided" if not self.decided else self.state

    def describe(self) -> str:
        lines = [
            f"{self.label}: release {self.release['id']} {self.state} at step {self.release.get('step_label')} "
            f"after {self.seconds:.0f} s, {self.sent} requests sent (served by {dict(self.served)}), "
            f"{len(self.errors)} client errors",
            f"  reason: {self.reason or '-'}",
            f"  comparisons (verdict/mode): {self.comparisons}",
            f"  warm pairs of the same work: {self.timed}",
            "  evaluations (holds that only count what is missing left out):",
        ]
        waiting = 0
        for e in self.evaluations:
            if e["decision"] == "hold" and (e["reason"] or "").startswith("needs "):
                waiting += 1
                continue
            lines.append(f"    step {e['step']} {e['decision']}: {e['reason'] or ''}")
        lines.append(f"    and {waiting} holds for more evidence")
        timed = [e for e in self.evaluations if ((e.get("evidence") or {}).get("speed") or {}).get("metrics")]
        if timed:
            last = timed[-1]
            lines.append(f"  speed at the last evaluation that timed pairs (step {last['step']}, {last['decision']}): "
                         f"{json.dumps(last['evidence']['speed'])}")
        lines.extend(f"  client error: {e}" for e in self.errors)
        recomputed = re.search(r"\d+ verdict\(s\) disagree", self.explained)
        lines.append(f"  release explain --recompute: {recomputed.group(0) if recomputed else self.explained[-300:]}")
        return "\n".join(lines)


def release_config(backends: str, plan: str, db: Path, admin: str) -> str:
    return f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[ledger]
path = "{db}"

[admin]
listen = "{admin}"
{backends}
[models.smollm2]
primary = "primary"

[plans.calibration]
evaluate_every_ms = 300
{plan}steps = {STEPS}
"""


def decided(release: dict) -> bool:
    """The release has its verdict: it ended, a person must act, or it waits on an alarm."""
    if release["state"] not in ("running", "paused"):
        return True
    return any(a in (release.get("waiting_for") or "") for a in ALARMS)


def run_release(workdir: Path, backends: str, plan: str, label: str, max_tokens: int = MAX_TOKENS,
                timeout: float = DECISION_TIMEOUT_S, think_s: float = THINK_S) -> Outcome:
    """Starts Switchyard with `backends` (named `primary` and `candidate`), starts a release of
    the plan, sends agents' traffic until the release is decided (or `timeout`), and returns
    what it decided, with its evaluations and the ledger's `explain --recompute`."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "ledger.db"
    admin = f"127.0.0.1:{free_port()}"
    config = release_config(backends, plan, db, admin)
    started_at = time.monotonic()
    with start_switchyard(workdir, config, identities_settled("primary", "candidate")) as p, \
            http_client(timeout=30.0) as http:
        started = http.post(f"http://{admin}/admin/releases",
                            json={"model": "smollm2", "candidate": "candidate", "plan": "calibration"})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]

        def current() -> dict:
            answer = http.get(f"http://{admin}/admin/releases").json()["releases"]
            return next(r for r in answer if r["id"] == rid)

        with Traffic(p.client, f"{label}-{rid[-6:]}", max_tokens, think_s) as traffic:
            try:
                poll(f"{label}: the release's verdict", lambda: decided(current()) or traffic.errors,
                     p.proc, timeout=timeout)
                done = True
            except StartupError:
                done = False
        history = http.get(f"http://{admin}/admin/releases/{rid}").json()
    seconds = time.monotonic() - started_at
    # Read once Switchyard has stopped, which flushes the ledger.
    ledger = sqlite3.connect(db)
    rows = ledger.execute("SELECT verdict, mode FROM comparisons").fetchall()
    timed = ledger.execute(
        "SELECT primary_contention IS candidate_contention, primary_backend = 'primary', primary_total_ms, candidate_total_ms"
        " FROM comparisons WHERE verdict IN ('match', 'equivalent') AND primary_warm = 1 AND candidate_warm = 1"
        " AND primary_total_ms > 0 AND candidate_total_ms > 0"
    ).fetchall()
    ledger.close()
    explained = run_switchyard("release", "explain", rid, "--recompute", "--ledger", str(db))
    return Outcome(
        label=label,
        release=history["release"],
        evaluations=history["evaluations"],
        seconds=seconds,
        sent=traffic.sent,
        served=dict(traffic.served),
        errors=list(traffic.errors),
        comparisons=dict(Counter(f"{v}/{m}" for v, m in rows)),
        timed=timed_pairs(timed),
        explained=explained,
        decided=done,
    )


def timed_pairs(rows: list[tuple]) -> dict:
    """What the ledger's warm pairs of the same work say of the candidate's total time, as
    candidate ÷ primary (a pair served by the candidate and copied to the primary turned round)."""
    def ratios(same: bool | None) -> list[float]:
        return sorted((c / p if forward else p / c) for s, forward, p, c in rows if same is None or bool(s) == same)

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 2) if values else None

    return {
        "pairs": len(rows),
        "same_contention": len(ratios(True)),
        "median_total_ratio_same_contention": median(ratios(True)),
        "median_total_ratio_all": median(ratios(None)),
    }


def check_recomputed(outcome: Outcome) -> None:
    assert " 0 verdict(s) disagree" in outcome.explained, outcome.explained[-4000:] + "\n" + outcome.describe()


# --- The tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan", list(PLANS))
def test_a_release_to_an_identical_llama_server_completes(engines: Engines, tmp_path: Path, plan: str) -> None:
    primary, primary_url = default_llama(engines.llama_bin, engines.gguf, tmp_path, "primary")
    try:
        candidate, candidate_url = default_llama(engines.llama_bin, engines.gguf, tmp_path, "candidate")
        try:
            backends = (llama_backend("primary", primary_url, engines.llama_bin, engines.gguf)
                        + llama_backend("candidate", candidate_url, engines.llama_bin, engines.gguf))
            outcome = run_release(tmp_path / "run", backends, PLANS[plan], f"A/A {plan}")
        finally:
            candidate.stop()
    finally:
        primary.stop()
    print("\n" + outcome.describe())
    assert not outcome.errors, outcome.describe()
    assert outcome.state == "completed", outcome.describe()
    assert not outcome.alarms(), outcome.describe()
    check_recomputed(outcome)


def test_a_candidate_slower_by_its_answers_is_held_or_aborted_on_speed(engines: Engines, tmp_path: Path) -> None:
    primary, primary_url = default_llama(engines.llama_bin, engines.gguf, tmp_path, "primary")
    try:
        candidate, candidate_url = default_llama(engines.llama_bin, engines.gguf, tmp_path, "candidate")
        try:
            with slow_proxy(candidate_url, SLOW_DELAY_S) as slow_url:
                backends = (llama_backend("primary", primary_url, engines.llama_bin, engines.gguf)
                            + llama_backend("candidate", slow_url, engines.llama_bin, engines.gguf))
                outcome = run_release(tmp_path / "run", backends, PLANS["defaults"], "slow candidate")
        finally:
            candidate.stop()
    finally:
        primary.stop()
    print("\n" + outcome.describe())
    assert not outcome.errors, outcome.describe()
    assert outcome.decided and outcome.verdict() in ("held", "aborted"), outcome.describe()
    reason = outcome.reason
    assert "interval" in reason and re.search(r"time to first token|total time|decode rate", reason), outcome.describe()
    assert "surely above" in reason, outcome.describe()
    check_recomputed(outcome)


def test_a_q2_k_candidate_is_aborted_on_its_answers(engines: Engines, requantized: dict[str, Path], tmp_path: Path) -> None:
    gguf = requantized["Q2_K"]
    primary, primary_url = default_llama(engines.llama_bin, engines.gguf, tmp_path, "primary")
    try:
        candidate, candidate_url = default_llama(engines.llama_bin, gguf, tmp_path, "candidate")
        try:
            backends = (llama_backend("primary", primary_url, engines.llama_bin, engines.gguf)
                        + llama_backend("candidate", candidate_url, engines.llama_bin, gguf))
            outcome = run_release(tmp_path / "run", backends, PLANS["defaults"], "Q2_K candidate")
        finally:
            candidate.stop()
    finally:
        primary.stop()
    print("\n" + outcome.describe())
    assert not outcome.errors, outcome.describe()
    assert outcome.state == "aborted", outcome.describe()
    assert "comparable pairs differ" in outcome.reason, outcome.describe()
    check_recomputed(outcome)
