"""The slowdown and cache-collapse detectors on the REAL llama-server, driven by the `openai` SDK.

A llama-server of the bundled GGUF, with its defaults, behind Switchyard with a ledger: its first
warm answers are its baseline and a quiet run finds nothing; then the engine is put under a CPU
cap (stopped and continued by signals, as `cpulimit` does: a quarter of the CPU it had) while
it keeps answering, and the detector finds it degraded — in `/readyz` (still ready), the admin
API, `switchyard_engine_degraded` and the ledger — and clears once the cap is lifted.

The cache: conversations go on turn after turn; a quiet run of them finds nothing; the engine is
restarted with prompt caching off (`--no-cache-prompt`) while they continue, and the detector
finds the collapse; restarted with caching on again, it clears.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from conftest import Proc, StartupError, http_client
from test_real_engines import (
    free_port,
    identities_settled,
    poll,
    required_path,
    start_switchyard,
)

#: Answers in a detector's window (`[detectors]`): the cache detector's, which judges on 8.
WINDOW = 10
#: The slowdown detector's window and the fewest it judges on. Rates of answers of 32 tokens on
#: two shared cores are noisy: a quiet run is judged clear with up to 4 of 16 answers slow (the
#: Wilson upper bound of 4/16 is 0.49), where a window of 10 allowed only one.
RATES_WINDOW = 16
RATES_LEAST = 12
#: How long the detector may take to judge once the answers are recorded: a few of its windows.
JUDGED_WITHIN_S = 30.0


@contextlib.contextmanager
def cpu_cap(pid: int, share: float) -> Iterator[None]:
    """Lets the process run only `share` of the time (stopped with SIGSTOP, continued with
    SIGCONT, every 20 ms), until the block ends."""
    done = threading.Event()
    period = 0.02

    def cap() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(period * (1 - share))
            os.kill(pid, signal.SIGCONT)
            done.wait(period * share)

    thread = threading.Thread(target=cap, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        os.kill(pid, signal.SIGCONT)


def ask(client, n: int) -> None:  # noqa: ANN001
    """`n` answers of 32 tokens each, one after another, each to a new question."""
    for i in range(n):
        r = client.chat.completions.with_raw_response.create(
            model="smollm2",
            messages=[{"role": "user", "content": f"Write a long story about a lighthouse keeper, part {i}."}],
            max_tokens=32,
            temperature=0.7,
        )
        assert r.http_response.status_code == 200
        assert r.parse().usage.completion_tokens >= 8


def detections(db: Path) -> list[tuple[str, str, str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT backend, detector, state FROM detections ORDER BY id").fetchall()


def llama_argv(port: int, *flags: str, context: int = 4096) -> list[str]:
    return [str(required_path("LLAMA_SERVER_BIN")), "-m", str(required_path("SMOLLM2_GGUF")),
            "-c", str(context), "--host", "127.0.0.1", "--port", str(port), *flags]


def engine_up(port: int, engine: Proc) -> None:
    """Waits until the llama-server on `port` answers its health check."""
    with http_client(timeout=5.0) as http:
        poll("llama-server", lambda: http.get(f"http://127.0.0.1:{port}/health").status_code == 200, engine)


def judged_config(port: int, admin: str, db: Path, baseline: int, sections: str = "",
                  window: int = WINDOW, least: int = 8) -> str:
    """Switchyard in front of the llama-server on `port`, with a ledger at `db`, the admin API at
    `admin`, and the detectors judging every 500 ms on `baseline` answers and windows of `window`
    (at least `least` answers); `sections`: the test's own detector settings."""
    return f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[admin]
listen = "{admin}"

[ledger]
path = "{db}"

[detectors]
every_ms = 500
baseline_requests = {baseline}
min_requests = {least}
window_requests = {window}
{sections}
[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:{port}"
artifact = "{required_path('SMOLLM2_GGUF')}"
binary = "{required_path('LLAMA_SERVER_BIN')}"

[models.smollm2]
primary = "llama"
"""


def test_a_llama_server_under_a_cpu_cap_is_found_degraded_and_cleared_when_it_is_lifted(tmp_path: Path) -> None:
    port = free_port()
    admin = f"127.0.0.1:{free_port()}"
    engine = Proc("llama-detected", llama_argv(port, context=2048), tmp_path / "llama.log")
    db = tmp_path / "ledger.db"
    config = judged_config(port, admin, db, baseline=RATES_WINDOW, window=RATES_WINDOW, least=RATES_LEAST)
    try:
        engine_up(port, engine)
        with start_switchyard(tmp_path, config, identities_settled("llama")) as p, http_client(timeout=10.0) as http:
            client = p.client()

            def verdict() -> dict:
                return http.get(f"http://{admin}/admin/backends").json()["backends"]["llama"]

            #: The latest judgement seen, for the message of a wait that fails.
            seen: list = [None]

            def judged(name: str) -> dict | None:
                shown = verdict()
                judgement = seen[0] = (shown["detectors"] or {}).get("slowdown")
                if not judgement or judgement["verdict"] != name:
                    return None
                evidence = judgement["evidence"]
                counted = isinstance(evidence, list) and all(f["requests"] >= RATES_LEAST for f in evidence)
                return shown if counted else None

            def degraded() -> list:
                return http.get(f"{p.url}/readyz").json()["backends"]["llama"]["degraded"]

            # The baseline (the first warm answers after the cold one), then a quiet window.
            ask(client, 2 * RATES_WINDOW + 1)
            try:
                quiet = poll("a clear verdict", lambda: judged("clear"), p.proc, timeout=JUDGED_WITHIN_S)
            except StartupError as e:
                raise AssertionError(f"the quiet run was not judged clear; the latest judgement: {seen[0]}") from e
            band = quiet["baseline"]["bands"][0]
            assert band["decode_requests"] == RATES_WINDOW and band["decode_tokens_per_s"] > 0, quiet
            assert degraded() == [] and detections(db) == []

            # A quarter of the CPU: every answer still comes, slower.
            started = time.monotonic()
            with cpu_cap(engine.popen.pid, 0.25):
                ask(client, RATES_WINDOW)
                poll("a degraded engine", degraded, p.proc, timeout=JUDGED_WITHIN_S)
            found_in = time.monotonic() - started
            readyz = http.get(f"{p.url}/readyz")
            assert readyz.status_code == 200 and readyz.json()["ready"] is True
            found = readyz.json()["backends"]["llama"]["degraded"][0]
            assert found["detector"] == "slowdown" and found["mode"] == "warn", found
            assert found["figures"]["slow"] >= RATES_LEAST and found["figures"]["median_ratio"] < 0.7, found
            metrics = http.get(f"{p.url}/metrics").text
            assert 'switchyard_engine_degraded{backend="llama",detector="slowdown"} 1' in metrics
            print(f"slowdown found {found_in:.1f} s after the cap, at {found['figures']['median_ratio']:.2f}x the baseline")

            # The cap lifted: the latest answers are as fast as the baseline again.
            ask(client, RATES_WINDOW)
            poll("the degradation cleared", lambda: degraded() == [], p.proc, timeout=JUDGED_WITHIN_S)
            metrics = http.get(f"{p.url}/metrics").text
            assert 'switchyard_engine_degraded{backend="llama",detector="slowdown"} 0' in metrics
            # Each change is queued for the ledger before it is in force; its writer commits in batches.
            expected = [("llama", "slowdown", "degraded"), ("llama", "slowdown", "cleared")]
            poll("the detections on the record", lambda: detections(db) == expected, p.proc, timeout=10)
    finally:
        engine.stop()


class Conversations:
    """A few conversations that go on turn after turn, in turn, as agents' do: each turn sends
    the whole conversation so far and a new question, and keeps the answer."""

    TOPICS = ("lighthouses", "tides", "bees", "glaciers")

    def __init__(self, client) -> None:  # noqa: ANN001
        self.client = client
        self.histories = [
            [{"role": "system", "content": f"You are a patient teacher. Today's subject is {topic}."}]
            for topic in self.TOPICS
        ]
        self.turns = 0

    def go_on(self, turns: int) -> None:
        for _ in range(turns):
            history = self.histories[self.turns % len(self.histories)]
            history.append({"role": "user", "content": f"Tell me one more fact, number {len(history) // 2}."})
            r = self.client.chat.completions.with_raw_response.create(
                model="smollm2", messages=history, max_tokens=12, temperature=0)
            assert r.http_response.status_code == 200
            history.append({"role": "assistant", "content": r.parse().choices[0].message.content})
            self.turns += 1


def continuing(db: Path) -> list[tuple[int, int, int]]:
    """The recorded answers marked as continuing a conversation their engine served: (id,
    cached tokens, prompt tokens)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            "SELECT id, cached_tokens, prompt_tokens FROM requests WHERE continues = 1 ORDER BY id").fetchall()


def test_a_llama_server_restarted_without_its_prompt_cache_is_found_and_cleared_when_it_caches_again(
    tmp_path: Path,
) -> None:
    port = free_port()
    admin = f"127.0.0.1:{free_port()}"
    engine = Proc("llama-cached", llama_argv(port), tmp_path / "llama.log")
    db = tmp_path / "ledger.db"
    config = judged_config(port, admin, db, baseline=8, sections='[detectors.slowdown]\nmode = "off"\n')
    try:
        engine_up(port, engine)
        with start_switchyard(tmp_path, config, identities_settled("llama")) as p, http_client(timeout=10.0) as http:
            talk = Conversations(p.client())

            def judged() -> dict | None:
                return ((http.get(f"http://{admin}/admin/backends").json()["backends"]["llama"]["detectors"]) or {}).get("cache")

            def degraded() -> list:
                return http.get(f"{p.url}/readyz").json()["backends"]["llama"]["degraded"]

            def judged_on(verdict: str, after: int) -> dict | None:
                """The detector's verdict once it has judged answers recorded after row `after`."""
                j = judged()
                return j if j and j["verdict"] == verdict and j["at_ms"] > after else None

            # The baseline: each conversation's later turns, served by the engine that holds the
            # earlier ones (the first turn of each is new). Then a quiet run as long as the
            # faulty one below: the first turn after each restart is new again (the restart
            # forgets what was served), the rest continue.
            talk.go_on(4 + 8 + 2)
            cached = continuing(db)
            assert len(cached) >= 8 and all(c is not None and c > 0 for _, c, _ in cached), cached
            quiet_from = int(time.time() * 1000)
            talk.go_on(WINDOW + 4)
            quiet = poll("a clear verdict", lambda: judged_on("clear", quiet_from), p.proc, timeout=JUDGED_WITHIN_S)
            baseline = http.get(f"http://{admin}/admin/backends").json()["backends"]["llama"]["baseline"]["cache"]
            assert baseline["requests"] == 8 and baseline["cached_share"] > 0.5, baseline
            assert quiet["evidence"]["missed"] <= 2, quiet
            assert degraded() == [] and detections(db) == []

            # Restarted with prompt caching off while the conversations go on.
            engine.stop()
            engine = Proc("llama-uncached", llama_argv(port, "--no-cache-prompt"), tmp_path / "llama-uncached.log")
            engine_up(port, engine)
            started = time.monotonic()
            talk.go_on(WINDOW + 4)
            poll("a degraded engine", degraded, p.proc, timeout=JUDGED_WITHIN_S)
            found_in = time.monotonic() - started
            readyz = http.get(f"{p.url}/readyz")
            assert readyz.status_code == 200 and readyz.json()["ready"] is True
            found = readyz.json()["backends"]["llama"]["degraded"][0]
            assert found["detector"] == "cache" and found["mode"] == "warn", found
            assert found["figures"]["missed"] >= 8 and found["figures"]["cached_share"] < 0.1, found
            metrics = http.get(f"{p.url}/metrics").text
            assert 'switchyard_engine_degraded{backend="llama",detector="cache"} 1' in metrics
            print(f"cache collapse found {found_in:.1f} s after the restart without a prompt cache: "
                  f"{found['figures']['cached_share']:.2f} cached against {found['figures']['baseline_cached_share']:.2f}")

            # Caching again: the conversations' later turns hit, and the finding clears.
            engine.stop()
            engine = Proc("llama-recached", llama_argv(port), tmp_path / "llama-recached.log")
            engine_up(port, engine)
            talk.go_on(WINDOW + 4)
            poll("the collapse cleared", lambda: degraded() == [], p.proc, timeout=JUDGED_WITHIN_S)
            metrics = http.get(f"{p.url}/metrics").text
            assert 'switchyard_engine_degraded{backend="llama",detector="cache"} 0' in metrics
            expected = [("llama", "cache", "degraded"), ("llama", "cache", "cleared")]
            poll("the detections on the record", lambda: detections(db) == expected, p.proc, timeout=10)
    finally:
        engine.stop()


def test_a_managed_llama_server_asked_for_gpu_layers_where_there_is_no_gpu_is_found_offloaded(tmp_path: Path) -> None:
    """The real llama-server, run by Switchyard twice: launched with `-ngl 99` on this machine
    (no GPU; the build has no GPU support), it says at start that it found no usable GPU and runs
    every layer on the CPU: the offload detector finds it. Launched with llama.cpp's default
    (`auto`, as many as fit), it says nothing of the GPU: no finding."""
    llama = json.dumps(str(required_path("LLAMA_SERVER_BIN")))
    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200

[detectors]
every_ms = 200

[backends.asked]
engine = "llama.cpp"
artifact = "{required_path('SMOLLM2_GGUF')}"
[backends.asked.launch]
command = [{llama}, "-m", "${{artifact}}", "-c", "2048", "--host", "127.0.0.1", "--port", "${{port}}", "-ngl", "99"]
start = "boot"

[backends.default]
engine = "llama.cpp"
artifact = "{required_path('SMOLLM2_GGUF')}"
[backends.default.launch]
command = [{llama}, "-m", "${{artifact}}", "-c", "2048", "--host", "127.0.0.1", "--port", "${{port}}"]
start = "boot"

[models.asked]
primary = "asked"

[models.default]
primary = "default"
"""
    with start_switchyard(tmp_path, config, identities_settled("asked", "default")) as p, http_client(timeout=10.0) as http:

        def backends() -> dict:
            return http.get(f"{p.url}/readyz").json()["backends"]

        found = poll("the offload found", lambda: backends()["asked"]["degraded"], p.proc, timeout=JUDGED_WITHIN_S)
        assert found[0]["detector"] == "offload", found
        assert found[0]["summary"] == "no usable GPU: every layer on the CPU, launched with -ngl 99", found
        assert "no usable GPU found" in found[0]["figures"]["line"], found
        # Both engines answer; the one at llama.cpp's default is not reported.
        for model in ("asked", "default"):
            r = p.client().chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
            assert r.choices[0].message.content is not None
        assert backends()["default"]["degraded"] == []
        metrics = http.get(f"{p.url}/metrics").text
        assert 'switchyard_engine_degraded{backend="asked",detector="offload"} 1' in metrics
