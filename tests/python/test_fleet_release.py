"""One canary release run by a fleet on the REAL llama-server: two Switchyards ("studio-a",
"studio-b") sharing one ledger on a PostgreSQL server of the test's own, in front of two
llama-servers of the bundled model (the primary `llama` and the candidate `next`), driven by
the `openai` SDK with a session header.

- The release, started on one instance, is the fleet's: one instance evaluates it (it holds the
  evaluator's lease: `switchyard_release_evaluator` is 1 there, 0 on the other), and both route
  by the same row: while it compares copies (shadow) every answer is the primary's on both;
  when it steps to the live split, each instance's `/readyz` shows the new weight within a
  couple of seconds of the other.
- The split is the same on both: each session sends one turn to each instance, and both turns
  land on the same side.
- The evaluating instance killed with `kill -9` in the live step does not stop the release: the
  other takes the lease over once it lapses (5 s), says so in its log, and carries the release
  on to its promotion, evaluating rows both instances wrote.
- `switchyard release explain --recompute --config` reads the fleet's rows and finds every
  stored verdict, the dead instance's and the survivor's, the same when counted again.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import openai

from conftest import Proc, http_client
from test_fleet import Postgres, config, postgres  # noqa: F401 (a fixture)
from test_real_engines import (
    REQUEST_TIMEOUT_S,
    free_port,
    identities_settled,
    poll,
    required_path,
    run_switchyard,
    start_switchyard,
)

INSTANCES = ("studio-a", "studio-b")
EVALUATOR = "switchyard_release_evaluator"
#: The evaluator's lease (observe's `LEASE_FOR`) and the longest the survivor may take past it
#: to see it lapsed (its look each second, a query).
LEASE_S, TAKEOVER_SLACK_S = 5.0, 3.0
#: The longest one instance may apply a step after the other has: each looks once a second.
APPLIED_WITHIN_S = 3.0

#: A candidate backend and a quick plan: copies compared in a shadow step, half the sessions on
#: the candidate, then promotion. The live step needs more candidate requests than the four
#: sessions of two turns before the kill can send, so that the kill comes mid-step, and than
#: their four turns again after it, while they are checked. Two llama-servers of one model can part at a near tie (their arithmetic
#: depends on what they batch together), so the plan accepts a minority of differing pairs.
RELEASE = """
[backends.next]
engine = "llama.cpp"
url = "{next_url}"
artifact = "{gguf}"
binary = "{binary}"
require_verified_identity = true

[plans.fleet]
evaluate_every_ms = 200
performance = {{ allowed = 1000.0, critical = 10000.0 }}
tolerance = {{ max_mismatch_share = 0.5 }}
steps = [
    {{ step = "shadow", min_pairs = 4 }},
    {{ step = "live", weight = 50, min_requests = 12 }},
    {{ step = "promote", bake_s = 0 }},
]
"""


#: One prompt for every session: the sessions differ by their header alone. Two llama-servers
#: answer one prompt alike; different prompts, partly cached in a slot, can part between them.
PROMPT = [{"role": "user", "content": "Name a colour. One word."}]


def llama_server(name: str, tmp_path: Path) -> tuple[Proc, str]:
    """A llama-server of the bundled model with one thread and one slot (the two share two
    cores with two Switchyards)."""
    port = free_port()
    proc = Proc(name, [str(required_path("LLAMA_SERVER_BIN")), "-m", str(required_path("SMOLLM2_GGUF")),
                       "-c", "2048", "-t", "1", "-np", "1", "--host", "127.0.0.1", "--port", str(port)], tmp_path / f"{name}.log")
    with http_client(timeout=5.0) as http:
        poll(name, lambda: http.get(f"http://127.0.0.1:{port}/health").status_code == 200, proc)
    return proc, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def engines(tmp_path: Path) -> Iterator[tuple[str, str]]:
    procs = []
    try:
        for name in ("llama", "next"):
            procs.append(llama_server(name, tmp_path))
        yield procs[0][1], procs[1][1]
    finally:
        for proc, _ in procs:
            proc.stop()


def test_a_release_runs_across_two_switchyards_and_survives_the_evaluators_kill(
        tmp_path: Path, postgres: Postgres) -> None:  # noqa: F811 (the fixture)
    with engines(tmp_path) as (llama_url, next_url), contextlib.ExitStack() as stack, \
            http_client(timeout=10.0) as http:
        fleet = {}
        for name in INSTANCES:
            home = tmp_path / name
            home.mkdir()
            admin = f"127.0.0.1:{free_port()}"
            extra = RELEASE.format(next_url=next_url, gguf=required_path("SMOLLM2_GGUF"),
                                   binary=required_path("LLAMA_SERVER_BIN"))
            proxy = stack.enter_context(start_switchyard(
                home, config(name, home, llama_url, postgres.url, admin, extra=extra),
                identities_settled("llama", "next")))
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0,
                                   timeout=REQUEST_TIMEOUT_S, http_client=openai.DefaultHttpxClient(trust_env=False))
            stack.callback(client.close)
            fleet[name] = (proxy, admin, client, home)

        # One instance evaluates: it holds the lease.
        def evaluators() -> dict[str, int] | None:
            seen = {n: metric_of(http, fleet[n][0].url, EVALUATOR) for n in INSTANCES}
            return seen if sorted(seen.values()) == [0, 1] else None
        holder = next(n for n, v in poll("one evaluator", evaluators, fleet[INSTANCES[0]][0].proc).items() if v)
        other = next(n for n in INSTANCES if n != holder)

        # Started on the instance that does not evaluate: the release is the fleet's.
        started = http.post(f"http://{fleet[other][1]}/admin/releases",
                            json={"model": "smollm2", "candidate": "next", "plan": "fleet"})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]

        def release() -> dict:
            return http.get(f"http://{fleet[other][1]}/admin/releases/{rid}").json()["release"]

        def routed(name: str) -> dict | None:
            return http.get(f"{fleet[name][0].url}/readyz").json()["models"]["smollm2"]["release"]

        poll("the release in both instances' routing", lambda: all(routed(n) for n in INSTANCES),
             fleet[other][0].proc, timeout=APPLIED_WITHIN_S + 2)

        def turn(name: str, session: str) -> str:
            raw = fleet[name][2].chat.completions.with_raw_response.create(
                model="smollm2", messages=PROMPT,
                max_tokens=8, temperature=0, extra_headers={"x-session-id": session})
            assert raw.parse().choices[0].message.content is not None
            return raw.headers["x-switchyard-variant"]

        # Shadow: every answer is the primary's on both, until the evaluator steps to the split.
        n = 0
        while (state := release())["step"] == 0:
            assert state["state"] == "running", state
            assert n < 60, f"the shadow step never ended: {state}"
            assert turn(INSTANCES[n % 2], f"shadow-{n}") == "primary"
            n += 1
        # Each instance applies the step within a couple of seconds of the other.
        applied = {}
        deadline = time.monotonic() + 2 * APPLIED_WITHIN_S
        while len(applied) < 2 and time.monotonic() < deadline:
            for name in INSTANCES:
                if name not in applied and (routed(name) or {}).get("weight") == 50:
                    applied[name] = time.monotonic()
            time.sleep(0.05)  # sampling when each shows it: a measurement, not a wait for a signal
        assert len(applied) == 2, f"applied by {sorted(applied)} only; readyz: {[routed(n) for n in INSTANCES]}"
        lag = abs(applied[INSTANCES[0]] - applied[INSTANCES[1]])
        assert lag <= APPLIED_WITHIN_S, lag

        # Live: each session's two turns, one on each instance, land on the same side.
        sides = {}
        for i in range(4):
            first, second = (INSTANCES[i % 2], INSTANCES[(i + 1) % 2])
            session = f"live-{i}"
            sides[session] = (turn(first, session), turn(second, session))
            assert sides[session][0] == sides[session][1], sides
        assert release()["step"] == 1, release()

        # The evaluator dies mid-step; the other takes the lease over and carries on.
        fleet[holder][0].proc.popen.kill()
        killed = time.monotonic()
        survivor = fleet[other]
        poll("the survivor evaluating", lambda: metric_of(http, survivor[0].url, EVALUATOR) == 1,
             survivor[0].proc, timeout=LEASE_S + TAKEOVER_SLACK_S)
        takeover = time.monotonic() - killed
        i = 0
        deadline = time.monotonic() + 300
        while (state := release())["state"] != "completed":
            assert state["state"] == "running", state
            assert time.monotonic() < deadline, state
            if i < 4:
                # The sessions of the live step, again: they go where they went.
                variant = turn(other, f"live-{i}")
                assert variant == sides[f"live-{i}"][0], (i, variant, sides)
            else:
                turn(other, f"after-{i}")
            i += 1
        assert routed(other)["promoted"], routed(other)
        log = (survivor[3] / "switchyard.log").read_text("utf-8", "replace")
        assert re.search(rf"took the evaluator's lease from an instance that did not renew it.*{holder}", log), log[-3000:]

    # Every stored verdict, by either instance, counted again from the fleet's rows agrees.
    explained = run_switchyard("release", "explain", rid, "--recompute", "--config", str(fleet[other][3] / "switchyard.toml"))
    assert " 0 verdict(s) disagree" in explained, explained
    by = psql(postgres, f"SELECT instance, count(*) FROM release_evaluations WHERE release_id = '{rid}' GROUP BY 1 ORDER BY 1")
    evaluated_by = dict(line.split("|") for line in by.splitlines())
    assert set(evaluated_by) == set(INSTANCES), by
    counted = psql(postgres, f"SELECT DISTINCT instance FROM requests WHERE release_id = '{rid}' ORDER BY 1")
    assert counted.split() == sorted(INSTANCES), counted
    print(f"\nfleet release {rid}: evaluator {holder} killed in the live step, {other} evaluating "
          f"{takeover:.1f} s later; step applied {lag:.2f} s apart; evaluations by {evaluated_by}; "
          f"{i} requests after the kill")


def metric_of(http, url: str, name: str) -> int:  # noqa: ANN001
    text = http.get(f"{url}/metrics").text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"no {name} in /metrics"
    return int(float(match.group(1)))


def psql(pg: Postgres, sql: str) -> str:
    done = subprocess.run([str(pg.bin / "psql"), "-At", "-d", pg.url, "-c", sql],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip()
