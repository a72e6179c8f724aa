"""Fixtures for the OpenAI-SDK suite: a fake engine and a Switchyard, each a real subprocess.

Every stack gets its own temporary directory, its own free loopback ports (both processes bind
`127.0.0.1:0` and print the address they got) and is torn down even when a test or the start-up
itself fails. Readiness is observed (`GET /readyz`), never guessed with a sleep.

Binaries: `SWITCHYARD_BIN` and `FAKE_ENGINE_BIN`, else `$CARGO_TARGET_DIR/debug/...`, else
`<repo>/target/debug/...`. Build them with `cargo build -j2 --workspace --bins`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

REPO = Path(__file__).resolve().parents[2]

#: Longest wait for a process to print its listening line.
START_TIMEOUT_S = 20.0
#: Longest wait for `/readyz` to report the backend ready with a verified identity.
READY_TIMEOUT_S = 20.0
#: Longest wait for a process to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0
#: How often `/readyz` is polled (the proxy probes its backends every 200 ms in these tests).
READY_POLL_S = 0.05
#: Timeout for every client request in the suite.
REQUEST_TIMEOUT_S = 15.0
#: How long a raw HTTP client (http_client) keeps an idle connection before closing it.
KEEPALIVE_EXPIRY_S = 1.0

BACKEND = "fake"
MODEL = "smollm2"
ALIAS = "default"


def target_dir() -> Path:
    """Cargo's target directory: `CARGO_TARGET_DIR` (relative to the cwd, as cargo reads it),
    else `<repo>/target`."""
    configured = os.environ.get("CARGO_TARGET_DIR")
    return Path(configured).resolve() if configured else REPO / "target"


def binary(env_var: str, name: str) -> Path:
    explicit = os.environ.get(env_var)
    path = Path(explicit) if explicit else target_dir() / "debug" / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{name} not found at {path}: build it with `cargo build -j2 --workspace --bins` "
            f"or point {env_var} at it",
            pytrace=False,
        )
    return path


def child_env() -> dict[str, str]:
    """The environment for the subprocesses: ours, less every `SWITCHYARD_*` variable, because
    Switchyard reads those as configuration overrides (`SWITCHYARD_SERVER__LISTEN`), so the test
    runner's own `SWITCHYARD_BIN`/`SWITCHYARD_CACHE` must not reach it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHYARD_")}
    env.setdefault("RUST_BACKTRACE", "1")
    return env


def _find_prctl():  # noqa: ANN202
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved here, not in the forked child: the child only makes the call.
_PRCTL = _find_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: on Linux, SIGKILL it if pytest dies without tearing down
    (killed by a timeout, say), so no engine or proxy outlives the suite."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


class StartupError(RuntimeError):
    pass


class Proc:
    """A subprocess whose stdout is read line by line on a thread and whose stderr goes to a file."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        try:
            self.popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._log,
                env=child_env(),
                preexec_fn=_die_with_parent,
            )
        except BaseException:
            self._log.close()
            raise
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self._lines.put(raw.decode("utf-8", "replace"))
        self._lines.put(None)

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            text = self.log_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return text[-limit:]

    def describe(self) -> str:
        code = self.popen.poll()
        state = "running" if code is None else f"exited with status {code}"
        return f"{self.name} ({' '.join(self.argv)}) {state}; stderr tail:\n{self.stderr_tail()}"

    def wait_for_line(self, pattern: str, timeout: float = START_TIMEOUT_S) -> re.Match[str]:
        """Waits for a stdout line matching `pattern` (whole line) and returns the match."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StartupError(
                    f"no line matching {pattern!r} within {timeout:.0f}s (stdout so far: {seen!r}); "
                    + self.describe()
                )
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=STOP_TIMEOUT_S)
                raise StartupError(
                    f"stdout closed before a line matching {pattern!r} (stdout: {seen!r}); "
                    + self.describe()
                )
            seen.append(line)
            match = re.fullmatch(pattern, line.rstrip("\r\n"))
            if match:
                return match

    def stop(self) -> int | None:
        """SIGTERM, wait, SIGKILL if it does not exit in time. Returns the exit status."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(timeout=STOP_TIMEOUT_S)
            return self.popen.returncode
        finally:
            self._reader.join(timeout=STOP_TIMEOUT_S)
            if self.popen.stdout is not None:
                self.popen.stdout.close()
            self._log.close()


ADDRESS = r"(http://127\.0\.0\.1:\d+)"


def http_client(**kwargs) -> httpx.Client:  # noqa: ANN003
    """An httpx client for the tests' loopback servers, without HTTP(S)_PROXY from the
    environment, that closes a connection idle for KEEPALIVE_EXPIRY_S rather than reuse it.

    httpx never sends a request again once it was written, so a request sent on a connection
    the server closes at that moment fails. Switchyard's engine client and the Rust tests'
    client (tests/src/client) send such a request again; here the connection is never that old:
    1 s is below every idle timeout the tests meet (Switchyard's client_idle_timeout_ms, 30 s by
    default; llama-server's keep-alive, 5 s, which is also httpx's default expiry, so a
    connection idle for just under 5 s could be reused as llama-server closes it; mlx_lm.server
    answers HTTP/1.0 and closes every connection itself). The SDK clients send max_retries=0
    (test_retries.py counts the SDK's own), so no retry hides a failure either.
    """
    return httpx.Client(limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S), trust_env=False, **kwargs)


@dataclass
class Stack:
    """A running fake engine with a Switchyard in front of it."""

    url: str
    engine_url: str
    artifact: Path
    artifact_sha256: str
    workdir: Path
    switchyard: Proc
    engine: Proc

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key="unused",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_S,
            # trust_env=False: loopback traffic must never go through an HTTP(S)_PROXY.
            http_client=openai.DefaultHttpxClient(trust_env=False),
        )

    def http(self) -> httpx.Client:
        return http_client(base_url=self.url, timeout=REQUEST_TIMEOUT_S)


def write_config(path: Path, engine_url: str, artifact: Path) -> None:
    # json.dumps gives a valid TOML basic string for any path.
    path.write_text(
        "\n".join(
            [
                "[server]",
                'listen = "127.0.0.1:0"',
                "probe_interval_ms = 200",
                "",
                f"[backends.{BACKEND}]",
                'engine = "llama.cpp"',
                f"url = {json.dumps(engine_url)}",
                f"artifact = {json.dumps(str(artifact))}",
                "",
                f"[models.{MODEL}]",
                f"aliases = [{json.dumps(ALIAS)}]",
                f"primary = {json.dumps(BACKEND)}",
                "",
            ]
        )
    )


def wait_ready(stack_url: str, proc: Proc, timeout: float = READY_TIMEOUT_S) -> dict:
    """Polls `/readyz` until Switchyard is ready and the backend's identity is verified."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    with http_client(base_url=stack_url, timeout=2.0) as http:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise StartupError("switchyard exited while waiting for /readyz; " + proc.describe())
            try:
                response = http.get("/readyz")
                last = f"{response.status_code} {response.text}"
                if response.status_code == 200:
                    body = response.json()
                    backend = body.get("backends", {}).get(BACKEND, {})
                    if body.get("ready") is True and backend.get("identity") == "verified":
                        return body
            except httpx.TransportError as e:
                last = f"transport error: {e!r}"
            time.sleep(READY_POLL_S)
    raise StartupError(
        f"/readyz not ready with a verified identity within {timeout:.0f}s; last answer: {last}; "
        + proc.describe()
    )


@contextlib.contextmanager
def run_stack(workdir: Path) -> Iterator[Stack]:
    switchyard_bin = binary("SWITCHYARD_BIN", "switchyard")
    engine_bin = binary("FAKE_ENGINE_BIN", "fake-engine")

    # A small stand-in for a GGUF file: the engine reports this path as its model_path, and the
    # configuration names it as the artifact, so the identity is verified.
    artifact = workdir / "smollm2-fake.gguf"
    artifact.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(range(256)) * 16 + workdir.name.encode())
    artifact_sha256 = hashlib.sha256(artifact.read_bytes()).hexdigest()

    with contextlib.ExitStack() as cleanup:
        engine = Proc(
            "fake-engine",
            [
                str(engine_bin),
                "--listen", "127.0.0.1:0",
                "--tokens", "12",
                "--prefill-ms", "2",
                "--token-ms", "1",
                "--model-path", str(artifact),
            ],
            workdir / "fake-engine.stderr.log",
        )
        cleanup.callback(engine.stop)
        engine_url = engine.wait_for_line(r"fake-engine listening on " + ADDRESS).group(1)

        config = workdir / "switchyard.toml"
        write_config(config, engine_url, artifact)
        switchyard = Proc(
            "switchyard",
            [str(switchyard_bin), "serve", "--config", str(config)],
            workdir / "switchyard.stderr.log",
        )
        cleanup.callback(switchyard.stop)
        url = switchyard.wait_for_line(r"switchyard listening on " + ADDRESS).group(1)
        wait_ready(url, switchyard)

        yield Stack(
            url=url,
            engine_url=engine_url,
            artifact=artifact,
            artifact_sha256=artifact_sha256,
            workdir=workdir,
            switchyard=switchyard,
            engine=engine,
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One fake engine + Switchyard per test module (start-up costs ~0.5 s; the tests only read)."""
    with run_stack(tmp_path_factory.mktemp("stack")) as s:
        yield s


@pytest.fixture
def client(stack: Stack) -> Iterator[openai.OpenAI]:
    c = stack.client()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with stack.http() as h:
        yield h
