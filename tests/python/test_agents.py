"""Coding agents through Switchyard, with their default model names (issue 46): Claude Code
(Anthropic's Messages API), Codex CLI (OpenAI's Responses API) and aider (chat completions),
each run once, non-interactively, at the versions tests/run pins, against the REAL
llama-server on the bundled model.

No alias names what the agents send (`claude-…`, `gpt-…`, changing with every release of the
agent): one model claims every name with the catch-all pattern `*`. Each agent must finish with
exit status 0 and an answer, and the ledger must hold its requests answered 200 with the name
it sent (`model_sent`) and the pattern that matched it (`model_pattern`).

llama-server runs with one slot of 8192 tokens (the model's own training context; Claude Code's
first request alone is about 4,200 tokens) and answers at most 64 tokens (`-n 64`), so that a
135M-parameter model, which rambles, ends its turns within seconds (Claude Code sets its own
`max_tokens`, so it is told 64 too: `CLAUDE_CODE_MAX_OUTPUT_TOKENS`).

Claude Code and Codex run a second time with their APIs served through chat completions
(issue 61), as on an engine that has only chat: the same llama-server behind a backend with
`agent_apis = "translate"`; the ledger shows each request answered 200 under the client's path
with the engine's path beside it. Not against mlx_lm.server itself: on these machines' CPUs it
reads a prompt at about 6 tokens a second, and each agent's first prompt is thousands of tokens
(the SDK tests in test_translation.py run against it, with short prompts).

Not covered here: Codex CLI releases after the one pinned send an `additional_tools` input item
that the pinned llama-server's Responses API refuses (400 "Cannot determine type of 'item'"),
and that Switchyard's translation refuses too (it has no chat form); docs/agents.md says so.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import Proc, child_env, http_client
from test_real_engines import REQUEST_TIMEOUT_S, Proxy, free_port, poll, required_path, start_switchyard

#: What one agent run may take: a first prefill of about 4,000 tokens on two CPU cores, a few
#: short turns.
AGENT_TIMEOUT_S = 300
PROMPT = "Reply with one word: hello."


@dataclass
class Stack:
    url: str
    ledger: Path
    workdir: Path
    proxy: Proxy


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("agents")
    llama_bin = required_path("LLAMA_SERVER_BIN")
    gguf = required_path("SMOLLM2_GGUF")
    port = free_port()
    llama = Proc(
        "llama-server",
        [str(llama_bin), "-m", str(gguf), "-c", "8192", "-np", "1", "-n", "64", "--host", "127.0.0.1", "--port", str(port)],
        workdir / "llama-server.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        with http_client(timeout=5.0) as http:
            poll("llama-server", lambda: http.get(f"{url}/health").status_code == 200, llama)
        (workdir / "llama-url").write_text(url)
        ledger = workdir / "ledger.db"
        config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 240000

[backends.llama]
engine = "llama.cpp"
url = "{url}"

[models.smollm2]
patterns = ["*"]
primary = "llama"

[ledger]
path = "{ledger}"
"""
        with start_switchyard(workdir, config, lambda r: r.get("ready") is True) as proxy:
            yield Stack(proxy.url, ledger, workdir, proxy)
    finally:
        llama.stop()


@pytest.fixture(scope="module")
def translated_stack(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A second Switchyard in front of the same llama-server, told to serve the agent APIs
    through chat completions (`agent_apis = "translate"`), as it serves them on an engine that
    has only chat: the agents then meet Switchyard's translation, not llama-server's own."""
    workdir = tmp_path_factory.mktemp("agents-translated")
    llama_url = (stack.workdir / "llama-url").read_text()
    ledger = workdir / "ledger.db"
    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 240000

[backends.llama]
engine = "llama.cpp"
url = "{llama_url}"
agent_apis = "translate"

[models.smollm2]
patterns = ["*"]
primary = "llama"

[ledger]
path = "{ledger}"
"""
    with start_switchyard(workdir, config, lambda r: r.get("ready") is True) as proxy:
        yield Stack(proxy.url, ledger, workdir, proxy)


def run_agent(name: str, argv: list[str], env: dict[str, str], cwd: Path, accept=lambda _out: False) -> str:  # noqa: ANN001
    """Runs one agent to its end; returns its standard output, failing with both streams unless
    it exits 0 (or `accept` takes its output as a run that ended for the model's sake)."""
    cwd.mkdir(parents=True, exist_ok=True)
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    done = subprocess.run(
        argv, cwd=cwd, env={**child_env(), "HOME": str(home), **env}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=AGENT_TIMEOUT_S,
    )
    assert done.returncode == 0 or accept(done.stdout), f"{name} exited {done.returncode}\nstdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
    return done.stdout


def requests_of(s: Stack, path: str) -> list[tuple]:
    """The ledger's rows for `path`: status, model, model_sent, model_pattern. The agent has
    exited, so every answer is written; the ledger's writer commits in batches, and no signal
    crosses the process boundary, so this polls until its rows are there."""
    found: list[tuple] = []

    def recorded() -> bool:
        nonlocal found
        with contextlib.closing(sqlite3.connect(s.ledger)) as db:
            found = db.execute(
                "SELECT status, model, model_sent, model_pattern FROM requests WHERE path = ? ORDER BY id", (path,)
            ).fetchall()
        return bool(found)

    poll(f"the ledger's rows for {path}", recorded, s.proxy.proc, timeout=REQUEST_TIMEOUT_S)
    return found


def assert_served_by_pattern(rows: list[tuple], sent_prefix: str) -> None:
    assert rows, "no request of the agent is in the ledger"
    for status, model, sent, pattern in rows:
        assert sent and sent.startswith(sent_prefix), rows
        assert (model, pattern) == ("smollm2", "*"), rows
    assert any(status == 200 for status, *_ in rows), rows


def ran_out_of_tokens(out: str) -> bool:
    """Claude Code's JSON result for a run whose model answered past its output token cap."""
    try:
        return json.loads(out).get("api_error") == "max_output_tokens"
    except ValueError:
        return False


def run_claude_code(stack: Stack) -> None:
    out = run_agent(
        "claude",
        # No built-in tools: a 135M-parameter model given Claude Code's tools calls them at
        # random, and each turn adds to a context of 8192 tokens until the engine refuses it.
        [str(required_path("CLAUDE_BIN")), "-p", PROMPT, "--output-format", "json", "--tools", ""],
        {
            "ANTHROPIC_BASE_URL": stack.url,
            "ANTHROPIC_API_KEY": "unused-by-switchyard",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # Claude Code asks for 32,000 tokens an answer, which overrides llama-server's `-n`.
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "64",
        },
        stack.workdir / "claude",
        accept=ran_out_of_tokens,
    )
    answer = json.loads(out)
    # The model may ramble past its 64 tokens: Claude Code then ends its run with an error of
    # its own (`max_output_tokens`), after Switchyard served every request of it.
    assert (answer["is_error"] is False and answer["result"].strip()) or ran_out_of_tokens(out), answer
    assert_served_by_pattern(requests_of(stack, "/v1/messages"), "claude-")


def test_claude_code_with_its_default_model_name(stack: Stack) -> None:
    run_claude_code(stack)


def run_codex(stack: Stack) -> None:
    provider = {
        "name": '"Switchyard"',
        "base_url": f'"{stack.url}/v1"',
        "wire_api": '"responses"',
        "env_key": '"SWITCHYARD_AGENT_KEY"',
    }
    settings = ['model_provider="switchyard"'] + [f"model_providers.switchyard.{k}={v}" for k, v in provider.items()]
    argv = [str(required_path("CODEX_BIN")), "exec", "--skip-git-repo-check"]
    for setting in settings:
        argv += ["-c", setting]
    workdir = stack.workdir / "codex"
    (workdir / "codex-home").mkdir(parents=True)
    out = run_agent(
        "codex", argv + [PROMPT],
        {"CODEX_HOME": str(workdir / "codex-home"), "SWITCHYARD_AGENT_KEY": "unused-by-switchyard"},
        workdir,
    )
    assert out.strip(), "codex printed no answer"
    assert_served_by_pattern(requests_of(stack, "/v1/responses"), "gpt-")


def test_codex_with_its_default_model_name(stack: Stack) -> None:
    run_codex(stack)


def engine_paths(s: Stack, path: str) -> set[tuple]:
    with contextlib.closing(sqlite3.connect(s.ledger)) as db:
        return set(db.execute("SELECT backend, engine_path FROM requests WHERE path = ?", (path,)).fetchall())


def test_claude_code_through_chat_completions(translated_stack: Stack) -> None:
    run_claude_code(translated_stack)
    assert engine_paths(translated_stack, "/v1/messages") == {("llama", "/v1/chat/completions")}


def test_codex_through_chat_completions(translated_stack: Stack) -> None:
    run_codex(translated_stack)
    assert engine_paths(translated_stack, "/v1/responses") == {("llama", "/v1/chat/completions")}


def test_aider_with_an_openai_model_name(stack: Stack) -> None:
    out = run_agent(
        "aider",
        [
            str(required_path("AIDER_BIN")), "--model", "openai/gpt-4.1", "--openai-api-base", f"{stack.url}/v1",
            "--openai-api-key", "unused-by-switchyard", "--message", PROMPT, "--yes-always", "--no-git",
            "--no-check-update", "--no-show-model-warnings", "--analytics-disable", "--no-auto-commits",
            "--map-tokens", "0", "--no-pretty", "--no-stream",
        ],
        {},
        stack.workdir / "aider",
    )
    assert out.strip(), "aider printed nothing"
    assert_served_by_pattern(requests_of(stack, "/v1/chat/completions"), "gpt-4.1")
