"""Switchyard in front of the real engines: llama.cpp's llama-server and mlx_lm.server, each
started here on a free loopback port with the bundled SmolLM2-135M model, driven through the
official openai SDK.

The engines come from `deploy/engines/` (tests/run installs them and passes their paths in
`LLAMA_SERVER_BIN`, `SMOLLM2_GGUF`, `MLX_PYTHON`, `MLX_MODEL_DIR`, `MLX_HF_HOME`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from conftest import Proc, StartupError, binary, http_client

#: Loading a model on these CPUs takes seconds; MLX converts nothing at start but is slower.
ENGINE_READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 120.0
POLL_S = 0.1

PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
#: Short answers: MLX decodes about 7 tokens/s on this CPU.
MAX_TOKENS = 12


def required_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run the suite through tests/run, which installs the engines", pytrace=False)
    path = Path(value)
    if not path.exists():
        pytest.fail(f"{name}={value} does not exist", pytrace=False)
    return path


def free_port() -> int:
    """A port free right now on 127.0.0.1. The engines take a port number, not a bound socket,
    so there is a short window in which another process could take it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def identities_settled(*names: str):  # noqa: ANN201
    """A `/readyz` check: the backends `names` are verified and their engine builds known (a
    release refuses to pin an identity still unknown)."""

    def check(readyz: dict) -> bool:
        backends = readyz.get("backends", {})
        return all(
            backends.get(b, {}).get("identity") == "verified" and not backends[b]["engine"].endswith("/unknown")
            for b in names
        )

    return check


def poll(what: str, check, proc: Proc, timeout: float = ENGINE_READY_TIMEOUT_S):  # noqa: ANN001, ANN201
    """Polls `check()` (a readiness endpoint: no signal crosses the process boundary) until it
    returns something truthy, failing early if the process died."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise StartupError(f"{what}: process exited; " + proc.describe())
        try:
            result = check()
            if result:
                return result
        except httpx.HTTPError as e:
            last = e
        time.sleep(POLL_S)
    raise StartupError(f"{what} not ready within {timeout:.0f}s (last error {last!r}); " + proc.describe())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_dir(root: Path) -> str:
    """The folder rule of shared/design.md: SHA-256 over sorted `relative/path NUL sha256\\n`."""
    lines = sorted(
        (p.relative_to(root).as_posix(), sha256_file(p)) for p in root.rglob("*") if p.is_file()
    )
    outer = hashlib.sha256()
    for rel, digest in lines:
        outer.update(rel.encode() + b"\0" + digest.encode() + b"\n")
    return outer.hexdigest()


@dataclass
class Engines:
    llama_url: str
    llama_bin: Path
    gguf: Path
    mlx_url: str
    mlx_dir: Path
    mlx_model_id: str
    llama: Proc
    mlx: Proc


@contextlib.contextmanager
def start_engines(workdir: Path) -> Iterator[Engines]:
    llama_bin = required_path("LLAMA_SERVER_BIN")
    gguf = required_path("SMOLLM2_GGUF")
    mlx_python = required_path("MLX_PYTHON")
    mlx_dir = required_path("MLX_MODEL_DIR")
    hf_home = required_path("MLX_HF_HOME")

    procs: list[Proc] = []
    try:
        llama_port = free_port()
        llama = Proc(
            "llama-server",
            [str(llama_bin), "-m", str(gguf), "-c", "2048", "--host", "127.0.0.1", "--port", str(llama_port)],
            workdir / "llama-server.log",
        )
        procs.append(llama)
        mlx_port = free_port()
        mlx = Proc(
            "mlx_lm.server",
            ["env", f"HF_HOME={hf_home}", "HF_HUB_OFFLINE=1", str(mlx_python), "-m", "mlx_lm", "server",
             "--model", str(mlx_dir), "--host", "127.0.0.1", "--port", str(mlx_port)],
            workdir / "mlx-server.log",
        )
        procs.append(mlx)
        llama_url = f"http://127.0.0.1:{llama_port}"
        mlx_url = f"http://127.0.0.1:{mlx_port}"
        with http_client(timeout=5.0) as http:
            poll("llama-server", lambda: http.get(f"{llama_url}/health").status_code == 200, llama)

            def mlx_models():  # noqa: ANN202
                r = http.get(f"{mlx_url}/v1/models")
                return r.status_code == 200 and r.json()["data"] and r.json()["data"][0]["id"]

            mlx_id = poll("mlx_lm.server", mlx_models, mlx)
        yield Engines(llama_url, llama_bin, gguf, mlx_url, mlx_dir, mlx_id, llama, mlx)
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    with start_engines(tmp_path_factory.mktemp("engines")) as e:
        yield e


@dataclass
class Proxy:
    url: str
    proc: Proc

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


@contextlib.contextmanager
def start_switchyard(workdir: Path, config: str, until) -> Iterator[Proxy]:  # noqa: ANN001
    path = workdir / "switchyard.toml"
    path.write_text(config)
    proc = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(path)], workdir / "switchyard.log")
    try:
        url = proc.wait_for_line(r"switchyard listening on (http://127\.0\.0\.1:\d+)").group(1)
        with http_client(timeout=5.0) as http:
            poll("switchyard", lambda: until(http.get(f"{url}/readyz").json()), proc)
        yield Proxy(url, proc)
    finally:
        proc.stop()


def base_config(e: Engines) -> str:
    return f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[backends.llama]
engine = "llama.cpp"
url = "{e.llama_url}"
artifact = "{e.gguf}"
binary = "{e.llama_bin}"
require_verified_identity = true

[backends.mlx]
engine = "mlx"
url = "{e.mlx_url}"
artifact = "{e.mlx_dir}"
require_verified_identity = true

[models.smollm2]
primary = "llama"

[models.smollm2-mlx]
primary = "mlx"
"""


def identities_known(readyz: dict) -> bool:
    b = readyz.get("backends", {})
    return (
        readyz.get("ready") is True
        and all(b.get(n, {}).get("identity") == "verified" for n in ("llama", "mlx"))
        and not b["mlx"]["engine"].endswith("/unknown")
    )


@pytest.fixture(scope="module")
def proxy(engines: Engines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    with start_switchyard(tmp_path_factory.mktemp("proxy"), base_config(engines), identities_known) as p:
        yield p


def direct_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


def chat_text(client: openai.OpenAI, model: str, stream: bool) -> str:
    if stream:
        chunks = client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=MAX_TOKENS, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    r = client.chat.completions.create(model=model, messages=PROMPT, temperature=0, max_tokens=MAX_TOKENS)
    return r.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_llama_cpp_through_switchyard_equals_direct(engines: Engines, proxy: Proxy, stream: bool) -> None:
    direct = chat_text(direct_client(engines.llama_url), "anything", stream)
    proxied = chat_text(proxy.client(), "smollm2", stream)
    assert direct.strip(), "the engine answered nothing"
    assert proxied == direct


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_mlx_through_switchyard_equals_direct(engines: Engines, proxy: Proxy, stream: bool) -> None:
    direct = chat_text(direct_client(engines.mlx_url), engines.mlx_model_id, stream)
    proxied = chat_text(proxy.client(), "smollm2-mlx", stream)
    assert direct.strip(), "the engine answered nothing"
    assert proxied == direct


def test_llama_cpp_identity_is_real_and_verified(engines: Engines, proxy: Proxy) -> None:
    raw = proxy.client().chat.completions.with_raw_response.create(model="smollm2", messages=PROMPT, temperature=0, max_tokens=4)
    h = raw.headers
    assert h["x-switchyard-artifact"] == "sha256:" + sha256_file(engines.gguf)
    # A llama-server built from the sdist reports b0-unknown: its identity is its binary's digest.
    props = httpx.get(f"{engines.llama_url}/props").json()
    if props["build_info"] == "b0-unknown":
        assert h["x-switchyard-engine"] == "llama.cpp/sha256:" + sha256_file(engines.llama_bin)
    else:
        assert h["x-switchyard-engine"] == "llama.cpp/" + props["build_info"]
    assert h["x-switchyard-backend"] == "llama"


def test_mlx_identity_is_real_and_verified(engines: Engines, proxy: Proxy) -> None:
    raw = proxy.client().chat.completions.with_raw_response.create(model="smollm2-mlx", messages=PROMPT, temperature=0, max_tokens=4)
    body = raw.parse()
    h = raw.headers
    assert h["x-switchyard-artifact"] == "sha256:" + sha256_dir(engines.mlx_dir)
    assert h["x-switchyard-engine"] == "mlx/" + body.system_fingerprint
    assert h["x-switchyard-backend"] == "mlx"


def test_llama_cpp_phases_are_its_timings(proxy: Proxy) -> None:
    with http_client(timeout=REQUEST_TIMEOUT_S) as http:
        r = http.post(f"{proxy.url}/v1/chat/completions", json={"model": "smollm2", "messages": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS})
        assert r.status_code == 200
        timings = r.json()["timings"]
        st = dict(
            (part.split(";")[0].strip(), part) for part in r.headers["server-timing"].split(",")
        )
        assert f"prefill;dur={timings['prompt_ms']:.3f}" in st["prefill"]
        assert f"decode;dur={timings['predicted_ms']:.3f}" in st["decode"]

        r = http.post(f"{proxy.url}/v1/chat/completions", json={"model": "smollm2", "messages": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": True})
        events = [e for e in r.text.split("\n\n") if e]
        last_timings = [json.loads(e[6:])["timings"] for e in events if e.startswith("data: {") and '"timings"' in e][-1]
        comment = json.loads(next(e for e in events if e.startswith(": switchyard "))[len(": switchyard "):])
        assert comment["server_timing"]["prefill"] == round(last_timings["prompt_ms"], 3)
        assert comment["server_timing"]["decode"] == round(last_timings["predicted_ms"], 3)
        assert events[-1] == "data: [DONE]"


def test_mlx_phases_are_measured_and_consistent(proxy: Proxy) -> None:
    with http_client(timeout=REQUEST_TIMEOUT_S) as http:
        r = http.post(
            f"{proxy.url}/v1/chat/completions",
            json={"model": "smollm2-mlx", "messages": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}},
        )
        assert r.status_code == 200
        events = [e for e in r.text.split("\n\n") if e]
        comment = json.loads(next(e for e in events if e.startswith(": switchyard "))[len(": switchyard "):])
        st = comment["server_timing"]
        assert comment["server_timing"].get("measured") is True
        assert "prefill" not in st, "MLX reports no prefill and the proxy cannot measure it apart"
        assert 0 <= st["ttft"] <= st["total"]
        assert st["decode"] >= 0
        assert comment["usage"]["completion_tokens"] > 0
        # Quirks smoothed: the usage chunk is a chunk, and `role` comes once.
        chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert sum(1 for c in chunks for ch in c["choices"] if "role" in ch.get("delta", {})) == 1


def test_a_client_chosen_name_never_unloads_the_mlx_model(engines: Engines, tmp_path: Path) -> None:
    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000
[backends.mlx]
engine = "mlx"
url = "{engines.mlx_url}"
[models.smollm2]
primary = "mlx"
"""
    with start_switchyard(tmp_path, config, lambda v: v.get("ready") is True) as p:
        proxied = chat_text(p.client(), "smollm2", stream=False)
    # Had the engine received "smollm2" it would have unloaded its model and answered 404 after
    # trying a hub download; instead it answered, and still serves its own model.
    assert proxied.strip()
    assert chat_text(direct_client(engines.mlx_url), engines.mlx_model_id, stream=False) == proxied
    models = httpx.get(f"{engines.mlx_url}/v1/models").json()
    assert models["data"][0]["id"] == engines.mlx_model_id
    assert "Fetching" not in engines.mlx.stderr_tail(100_000)


def test_a_different_artifact_is_unverified_and_refused_when_required(engines: Engines, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    shutil.copyfile(engines.gguf, other)
    with open(other, "ab") as f:
        f.write(b"\0")
    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
[backends.strict]
engine = "llama.cpp"
url = "{engines.llama_url}"
artifact = "{other}"
require_verified_identity = true
[backends.lenient]
engine = "llama.cpp"
url = "{engines.llama_url}"
artifact = "{other}"
[models.strict]
primary = "strict"
[models.lenient]
primary = "lenient"
"""

    def hashed(v: dict) -> bool:
        return all(v.get("backends", {}).get(n, {}).get("identity") == "unverified" for n in ("strict", "lenient"))

    with start_switchyard(tmp_path, config, hashed) as p:
        with http_client(timeout=REQUEST_TIMEOUT_S) as http:
            readyz = http.get(f"{p.url}/readyz").json()
            assert str(engines.gguf.name) in readyz["backends"]["strict"]["identity_note"]
            body = {"messages": PROMPT, "temperature": 0, "max_tokens": 4}
            r = http.post(f"{p.url}/v1/chat/completions", json={**body, "model": "lenient"})
            assert r.status_code == 200
            assert r.headers["x-switchyard-artifact"] == "unverified:sha256:" + sha256_file(other)
            r = http.post(f"{p.url}/v1/chat/completions", json={**body, "model": "strict"})
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "identity_unverified"
        with pytest.raises(openai.APIStatusError) as err:
            p.client().chat.completions.create(model="strict", messages=PROMPT, max_tokens=4)
        assert err.value.status_code == 503


def server_timing(value: str) -> dict[str, float]:
    out = {}
    for part in value.split(","):
        name, *params = part.strip().split(";")
        for p in params:
            if p.startswith("dur="):
                out[name] = float(p[4:])
    return out


def test_requests_sent_as_switchyard_starts_listening_are_served_never_502(engines: Engines, tmp_path: Path) -> None:
    """Issue 43: requests that arrive the moment Switchyard listens, before any probe has named
    what the engines serve (for mlx_lm.server that takes a one-token generation), wait for the
    first probe and are served; none is called unreachable. Each engine gets one streamed and
    one unstreamed request, all four at once."""
    path = tmp_path / "switchyard.toml"
    path.write_text(base_config(engines))
    proc = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(path)], tmp_path / "switchyard.log")
    try:
        url = proc.wait_for_line(r"switchyard listening on (http://127\.0\.0\.1:\d+)").group(1)

        def ask(model: str, stream: bool) -> httpx.Response:
            body = {"model": model, "stream": stream, "max_tokens": 4, "temperature": 0, "messages": PROMPT}
            with http_client(timeout=REQUEST_TIMEOUT_S) as http:
                response = http.post(f"{url}/v1/chat/completions", json=body)
                response.read()
                return response

        asked = [(model, stream) for model in ("smollm2", "smollm2-mlx") for stream in (False, True)]
        with concurrent.futures.ThreadPoolExecutor(len(asked)) as pool:
            answers = list(pool.map(lambda a: ask(*a), asked))
        for (model, stream), response in zip(asked, answers):
            what = f"{model} stream={stream}: {response.status_code} {response.text[:300]}"
            assert response.status_code in (200, 503), what
            if response.status_code == 503:
                # Only once the wait's bound passed, and then the client is told when to retry.
                assert response.json()["error"]["code"] == "backend_not_ready", what
                assert response.headers["retry-after"], what
                continue
            if model == "smollm2-mlx":
                # mlx_lm.server's first probe takes a one-token generation (seconds here): the
                # request waited for it, and the wait is its load phase.
                assert "load" in server_timing(response.headers["server-timing"]), what
            assert response.headers["x-switchyard-backend"] == ("llama" if model == "smollm2" else "mlx")
            if stream:
                assert response.text.rstrip().endswith("data: [DONE]"), what
            else:
                assert response.json()["choices"][0]["message"]["content"], what
        assert any(r.status_code == 200 for r in answers), [r.status_code for r in answers]
    finally:
        proc.stop()


def test_the_ledger_records_what_the_responses_carried(engines: Engines, tmp_path: Path) -> None:
    import sqlite3
    import subprocess

    db = tmp_path / "ledger.db"
    config = base_config(engines) + f'\n[ledger]\npath = "{db}"\n'
    seen: dict[str, dict] = {}
    with start_switchyard(tmp_path, config, identities_known) as p:
        with http_client(timeout=REQUEST_TIMEOUT_S) as http:
            for model in ("smollm2", "smollm2-mlx"):
                for stream in (False, True):
                    body = {"model": model, "messages": PROMPT, "temperature": 0, "max_tokens": 6, "stream": stream}
                    r = http.post(f"{p.url}/v1/chat/completions", json=body)
                    assert r.status_code == 200
                    if stream:
                        comment = next(l for l in r.text.splitlines() if l.startswith(": switchyard "))
                        total = json.loads(comment[len(": switchyard "):])["server_timing"]["total"]
                    else:
                        total = server_timing(r.headers["server-timing"])["total"]
                    seen[r.headers["x-request-id"]] = {
                        "model": model,
                        "stream": stream,
                        "engine": r.headers["x-switchyard-engine"],
                        "artifact": r.headers["x-switchyard-artifact"],
                        "workload": r.headers["x-switchyard-workload"],
                        "total": total,
                    }
            # A client that leaves mid-stream.
            body = {"model": "smollm2", "messages": PROMPT, "temperature": 0, "max_tokens": 200, "stream": True}
            with http.stream("POST", f"{p.url}/v1/chat/completions", json=body) as r:
                dropped_id = r.headers["x-request-id"]
                next(r.iter_raw())
    # Switchyard has stopped (SIGTERM drains and flushes the ledger).
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = {r["request_id"]: r for r in conn.execute("SELECT * FROM requests")}
    assert len(rows) == len(seen) + 1
    first_per_model: dict[str, str] = {}
    for rid, want in seen.items():
        row = rows[rid]
        assert row["engine"] == want["engine"]
        assert row["artifact"] == want["artifact"]
        assert row["workload"] == want["workload"]
        assert abs(row["total_ms"] - want["total"]) < 0.001
        assert row["streamed"] == int(want["stream"])
        assert row["client_disconnected"] == 0
        first_per_model.setdefault(want["model"], rid)
    for model, rid in first_per_model.items():
        assert rows[rid]["warm"] == 0, f"the first {model} request met a cold engine"
    assert sum(1 for r in rows.values() if r["warm"] == 1) == len(rows) - 2
    assert rows[dropped_id]["client_disconnected"] == 1
    assert conn.execute("SELECT COUNT(*) FROM identities WHERE backend = 'mlx' AND engine LIKE 'mlx/0.%'").fetchone()[0] >= 1

    bin_ = str(binary("SWITCHYARD_BIN", "switchyard"))
    report = json.loads(subprocess.run([bin_, "report", "--format", "json", "--ledger", str(db)], check=True, capture_output=True, text=True).stdout)
    assert sum(g["requests"] for g in report["groups"]) == len(rows)
    for g in report["groups"]:
        t = g["total_ms"]
        if t["n"]:
            assert t["p50"] <= t["p95"] <= t["p99"]
    tsv = subprocess.run([bin_, "report", "--format", "tsv", "--ledger", str(db)], check=True, capture_output=True, text=True).stdout
    header, *lines = [l.split("\t") for l in tsv.strip().splitlines()]
    assert sum(int(l[header.index("requests")]) for l in lines) == len(rows)
    md = subprocess.run([bin_, "report", "--ledger", str(db)], check=True, capture_output=True, text=True).stdout
    assert "| smollm2-mlx | mlx | primary | - | cold | 1 |" in md


def test_a_llama_server_restarted_on_another_model_between_probes_is_caught_by_its_answers(engines: Engines, tmp_path: Path) -> None:
    """llama-server names its served model (`--alias`, else the model's path) in every answer.
    Restarted under another name between two probes (an hour apart here), its first answers
    contradict the probed identity: stamped unverified, refused by a backend that requires a
    verified identity, counted; a probe then looks again, and the engine, on the same GGUF,
    is verified anew, with cold caches."""
    import sqlite3

    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def llama(name: str, *extra: str) -> Proc:
        proc = Proc(name, [str(engines.llama_bin), "-m", str(engines.gguf), "-c", "2048", "--host", "127.0.0.1", "--port", str(port), *extra], tmp_path / f"{name}.log")
        with http_client(timeout=5.0) as http:
            poll(name, lambda: http.get(f"{url}/health").status_code == 200, proc)
        return proc

    db = tmp_path / "ledger.db"
    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 3600000
first_byte_timeout_ms = 120000

[backends.lenient]
engine = "llama.cpp"
url = "{url}"
artifact = "{engines.gguf}"

[backends.strict]
engine = "llama.cpp"
url = "{url}"
artifact = "{engines.gguf}"
require_verified_identity = true

[models.lenient]
primary = "lenient"

[models.strict]
primary = "strict"

[ledger]
path = "{db}"
"""

    def verified(v: dict) -> bool:
        b = v.get("backends", {})
        return all(b.get(n, {}).get("identity") == "verified" for n in ("lenient", "strict"))

    digest = "sha256:" + sha256_file(engines.gguf)
    first = llama("llama-server-first")
    try:
        with start_switchyard(tmp_path, config, verified) as p:
            client = p.client()

            def ask(model: str, request_id: str):  # noqa: ANN202
                return client.chat.completions.with_raw_response.create(
                    model=model, messages=PROMPT, temperature=0, max_tokens=4, extra_headers={"x-request-id": request_id}
                )

            assert ask("lenient", "before").headers["x-switchyard-artifact"] == digest
            first.stop()
            second = llama("llama-server-second", "--alias", "smollm2-restarted")
            try:
                raw = ask("lenient", "contradicted")
                assert raw.headers["x-switchyard-artifact"] == "unverified:" + digest
                assert raw.parse().choices[0].message.content
                with pytest.raises(openai.APIStatusError) as refused:
                    ask("strict", "refused")
                assert refused.value.status_code == 503
                error = refused.value.response.json()["error"]
                assert error["code"] == "identity_unverified"
                assert "answered as model `smollm2-restarted`" in error["message"], error
                with http_client(timeout=5.0) as http:
                    metrics = http.get(f"{p.url}/metrics").text
                for backend in ("lenient", "strict"):
                    assert f'switchyard_identity_contradictions_total{{backend="{backend}"}} 1\n' in metrics

                def reprobed(v: dict) -> bool:
                    return verified(v) and all(
                        v["backends"][n].get("served_model") == "smollm2-restarted" for n in ("lenient", "strict")
                    )

                with http_client(timeout=5.0) as http:
                    poll("the probe asked for", lambda: reprobed(http.get(f"{p.url}/readyz").json()), p.proc)
                assert ask("strict", "after-probe").headers["x-switchyard-artifact"] == digest
            finally:
                second.stop()
    finally:
        first.stop()
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    rows = {r["request_id"]: r for r in conn.execute("SELECT * FROM requests")}
    assert rows["contradicted"]["artifact"] == "unverified:" + digest
    assert rows["refused"]["status"] == 503
    # The engine serves under a new name: its caches are cold again.
    assert rows["after-probe"]["warm"] == 0


def test_admin_events_show_a_llama_server_going_down_and_up_again(engines: Engines, tmp_path: Path) -> None:
    """`switchyard admin events` follows the admin API's event stream: a real llama-server
    stopped shows as its backend going down, and started again on the same port and GGUF, as
    ready with the same verified artifact."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    admin = f"http://127.0.0.1:{free_port()}"

    def llama(name: str) -> Proc:
        proc = Proc(name, [str(engines.llama_bin), "-m", str(engines.gguf), "-c", "2048", "--host", "127.0.0.1", "--port", str(port)], tmp_path / f"{name}.log")
        with http_client(timeout=5.0) as http:
            poll(name, lambda: http.get(f"{url}/health").status_code == 200, proc)
        return proc

    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200

[admin]
listen = "{admin.removeprefix("http://")}"

[backends.llama]
engine = "llama.cpp"
url = "{url}"
artifact = "{engines.gguf}"

[models.smollm2]
primary = "llama"
"""
    digest = "sha256:" + sha256_file(engines.gguf)
    ready = rf".* backend llama: ready \(identity verified; engine llama\.cpp/\S+; artifact {digest}\)"
    first = llama("llama-server-events-1")
    try:
        with start_switchyard(tmp_path, config, lambda v: v.get("backends", {}).get("llama", {}).get("identity") == "verified"):
            events = Proc("admin-events", [str(binary("SWITCHYARD_BIN", "switchyard")), "admin", "events", "--url", admin], tmp_path / "events.log")
            try:
                # The stream opens with each backend's state now.
                events.wait_for_line(ready)
                first.stop()
                events.wait_for_line(r".* backend llama: failed: .*", timeout=ENGINE_READY_TIMEOUT_S)
                second = llama("llama-server-events-2")
                try:
                    events.wait_for_line(ready, timeout=ENGINE_READY_TIMEOUT_S)
                finally:
                    second.stop()
            finally:
                events.stop()
    finally:
        first.stop()


# --- Shadow traffic and `switchyard compare` on the real engines --------------------------------

SUITE = Path(__file__).resolve().parents[1] / "prompts" / "suite.jsonl"


# llama-server's greedy answer can change with what ran before it on this CPU: a prompt reused
# from its cache, or a request batched with another in a second slot, is computed in another
# order. One slot and no prompt cache give the same tokens for the same request every time.
DETERMINISTIC_LLAMA = ("-np", "1", "--no-cache-prompt", "-cram", "0")


@contextlib.contextmanager
def second_llama_server(e: Engines, workdir: Path, *extra: str, name: str = "llama-server-2") -> Iterator[str]:
    """Another llama-server on the same GGUF: a candidate that must give the same answers."""
    port = free_port()
    proc = Proc(
        name,
        [str(e.llama_bin), "-m", str(e.gguf), "-c", "2048", "--host", "127.0.0.1", "--port", str(port), *extra],
        workdir / f"{name}.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        with http_client(timeout=5.0) as http:
            poll(name, lambda: http.get(f"{url}/health").status_code == 200, proc)
        yield url
    finally:
        proc.stop()


def shadow_config(e: Engines, db: Path, candidate: str, candidate_url: str | None = None) -> str:
    extra = ""
    if candidate_url:
        extra = f"""
[backends.{candidate}]
engine = "llama.cpp"
url = "{candidate_url}"
artifact = "{e.gguf}"
binary = "{e.llama_bin}"
"""
    config = base_config(e).replace(
        '[models.smollm2]\nprimary = "llama"\n',
        f'[models.smollm2]\nprimary = "llama"\nshadow = {{ backend = "{candidate}", sample = 1.0, max_in_flight = 1 }}\n',
    )
    return config + extra + f'\n[ledger]\npath = "{db}"\n'


def wait_comparisons(proxy: Proxy, n: int) -> None:
    """Polls /metrics (no signal crosses the process boundary) until `n` comparisons are recorded."""
    def recorded() -> bool:
        with http_client(timeout=5.0) as http:
            text = http.get(f"{proxy.url}/metrics").text
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("switchyard_shadow_comparisons_total{")
        )
        return total >= n

    poll("shadow comparisons", recorded, proxy.proc, timeout=REQUEST_TIMEOUT_S)


def run_switchyard(*args: str) -> str:
    import subprocess

    done = subprocess.run([str(binary("SWITCHYARD_BIN", "switchyard")), *args], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def shadowed_requests(proxy: Proxy, prompts: list[str], repeats: int, max_tokens: int) -> int:
    """Sends each request after the previous one's shadow is recorded: one pool slot is then
    always free, and no pair is measured while another request runs on either engine."""
    client = proxy.client()
    sent = 0
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        for _ in range(repeats):
            for stream in (False, True):
                raw = client.chat.completions.with_raw_response.create(
                    model="smollm2", messages=messages, temperature=0, max_tokens=max_tokens, stream=stream
                )
                assert raw.headers["x-switchyard-backend"] == "llama"
                parsed = raw.parse()
                if stream:
                    "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
                sent += 1
                wait_comparisons(proxy, sent)
    return sent


def test_shadowing_a_second_llama_server_matches_every_time(engines: Engines, tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "ledger.db"
    with second_llama_server(engines, tmp_path) as url2:
        config = shadow_config(engines, db, "llama2", url2)
        with start_switchyard(tmp_path, config, lambda r: identities_known(r) and r["backends"]["llama2"]["identity"] == "verified") as p:
            sent = shadowed_requests(p, ["What is the capital of France? Answer in one sentence."], 4, MAX_TOKENS)
    # Read once Switchyard has stopped, which flushes the ledger: /metrics counts a comparison
    # before the ledger's writer has committed it.
    report = json.loads(run_switchyard("report", "--comparisons", "--format", "json", "--ledger", str(db)))
    rows = sqlite3.connect(db).execute("SELECT verdict, reason, primary_output, candidate_output FROM comparisons").fetchall()
    assert len(rows) == sent
    assert all(r[0] == "match" and r[2] == r[3] and r[2].startswith("sha256:") for r in rows), rows
    # The first request met both engines cold; the warm ones form one group per transport, and
    # both get ratios with their spread.
    assert report["cold_pairs_excluded"] == 1
    assert len(report["groups"]) == 2
    assert sum(g["counts"]["pairs"] for g in report["groups"]) == sent - 1
    for g in report["groups"]:
        assert g["status"] == "ratios", g
        for metric in ("ttft", "total") if g["streamed"] else ("total",):
            r = g["ratios"][metric]
            assert r["n"] == g["counts"]["match"] >= 3 and 0 < r["min"] <= r["median"] <= r["max"], (metric, r)
    assert report["summaries"][0]["ratios"] is not None


def test_shadowing_mlx_records_whatever_is_true(engines: Engines, tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "ledger.db"
    with start_switchyard(tmp_path, shadow_config(engines, db, "mlx"), identities_known) as p:
        prompts = ["What is the capital of France? Answer in one sentence.", "Name three primary colors."]
        sent = shadowed_requests(p, prompts, 4, 8)
    report = json.loads(run_switchyard("report", "--comparisons", "--format", "json", "--ledger", str(db)))
    rows = sqlite3.connect(db).execute("SELECT verdict, primary_output, candidate_output FROM comparisons").fetchall()
    assert len(rows) == sent
    for verdict, primary, candidate in rows:
        assert primary.startswith("sha256:") and candidate.startswith("sha256:")
        assert verdict == ("match" if primary == candidate else "mismatch")
    for g in report["groups"]:
        if g["counts"]["mismatch"]:
            assert g["status"] == "correctness-failed" and g["ratios"] is None, g
        else:
            assert g["status"] == "ratios", g
    for s in report["summaries"]:
        if any(g["counts"]["mismatch"] for g in report["groups"] if g["streamed"] == s["streamed"]):
            assert s["ratios"] is None


def test_a_seeded_request_between_llama_and_mlx_is_incomparable_with_its_reason(engines: Engines, tmp_path: Path) -> None:
    """Issue 44: llama.cpp's and MLX's samplers draw differently from the same seed, so a seeded
    sampled pair between them differs by construction. It is recorded incomparable, with the
    reason and both engine builds, never as a mismatch that would count against the candidate."""
    import sqlite3

    db = tmp_path / "ledger.db"
    with start_switchyard(tmp_path, shadow_config(engines, db, "mlx"), identities_known) as p:
        client = p.client()
        messages = [{"role": "user", "content": "Name three primary colors."}]
        for sent, stream in enumerate((False, True), start=1):
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=messages, temperature=0.8, seed=42, max_tokens=8, stream=stream
            )
            assert raw.headers["x-switchyard-backend"] == "llama"
            parsed = raw.parse()
            if stream:
                "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
            wait_comparisons(p, sent)
    rows = sqlite3.connect(db).execute(
        "SELECT verdict, reason, primary_engine, candidate_engine, candidate_output FROM comparisons"
    ).fetchall()
    assert len(rows) == 2, rows
    for verdict, reason, primary_engine, candidate_engine, candidate_output in rows:
        assert verdict == "incomparable", rows
        assert reason.startswith("sampling not deterministic across engines"), reason
        assert primary_engine.startswith("llama.cpp/") and candidate_engine.startswith("mlx/"), rows
        assert f"primary {primary_engine}, candidate {candidate_engine}" in reason, reason
        # Both sides ran: the pair is incomparable for its sampling, not for want of an answer.
        assert candidate_output.startswith("sha256:"), rows


def test_compare_runs_the_suite_on_both_engines_cold_and_warm_apart(engines: Engines, tmp_path: Path) -> None:
    config = tmp_path / "switchyard.toml"
    config.write_text(base_config(engines) + f'\n[ledger]\npath = "{tmp_path / "ledger.db"}"\n')
    out = tmp_path / "report"
    printed = run_switchyard(
        "compare", "--config", str(config), "--suite", str(SUITE), "--primary", "llama", "--candidate", "mlx",
        "--repeat", "3", "--include-cold", "--format", "json", "--save", str(out),
    )
    report = json.loads(printed)
    lines = len(SUITE.read_text().splitlines())
    groups = report["groups"]
    # Each suite line makes one warm group (3 pairs) and one cold group (1 pair).
    assert sorted((g["warm"], g["counts"]["pairs"]) for g in groups) == [(False, 1)] * lines + [(True, 3)] * lines
    for g in groups:
        assert g["primary"]["engine"].startswith("llama.cpp/sha256:") and g["candidate"]["engine"].startswith("mlx/")
        if g["counts"]["mismatch"] or g["counts"]["candidate_error"]:
            assert g["ratios"] is None, g
        if g["status"] == "ratios":
            assert g["warm"] and g["counts"]["match"] == 3
    assert {s["warm"] for s in report["summaries"]} == {True, False}
    assert json.loads((out / "comparison.json").read_text()) == report
    tsv = [l.split("\t") for l in (out / "comparison.tsv").read_text().splitlines()]
    assert all(len(row) == len(tsv[0]) for row in tsv)
    assert len(tsv) == 1 + len(report["summaries"]) + len(groups)
    assert "## By workload" in (out / "comparison.md").read_text()


def test_a_release_judges_mlx_against_llama_as_the_comparator_does(engines: Engines, tmp_path: Path) -> None:
    """A canary release of smollm2 from llama-server to mlx_lm.server runs its shadow step on
    real traffic from the openai SDK. Its verdict — on to the gate when every pair matched, an
    abort naming where the first differing answers part otherwise — agrees with what the
    comparator (`switchyard report --comparisons`) says of the very pairs it judged, and with
    what a separate `switchyard compare` run of the same requests says. The primary is a
    llama-server with one slot and no prompt cache, whose greedy answers do not depend on what
    ran before (mlx_lm.server's do not either)."""
    import sqlite3

    with second_llama_server(engines, tmp_path, *DETERMINISTIC_LLAMA) as url:
        release_against_compare(dataclasses.replace(engines, llama_url=url), tmp_path, sqlite3)


def release_against_compare(engines: Engines, tmp_path: Path, sqlite3) -> None:  # noqa: ANN001
    db = tmp_path / "ledger.db"
    admin = f"127.0.0.1:{free_port()}"
    config = base_config(engines) + f"""
[ledger]
path = "{db}"

[admin]
listen = "{admin}"

[plans.real]
evaluate_every_ms = 200
steps = [{{ step = "shadow", min_pairs = 4 }}, {{ step = "gate" }}]
"""
    prompts = ["What is the capital of France? Answer in one sentence.", "Name three primary colors."]
    with start_switchyard(tmp_path, config, identities_known) as p, http_client(timeout=10.0) as http:
        started = http.post(f"http://{admin}/admin/releases", json={"model": "smollm2", "candidate": "mlx", "plan": "real"})
        assert started.status_code == 201, started.text
        rid = started.json()["id"]
        assert started.json()["pinned"]["candidate"]["engine"].startswith("mlx")

        def release() -> dict:
            return http.get(f"http://{admin}/admin/releases/{rid}").json()["release"]

        def decided():  # noqa: ANN202
            r = release()
            return r if r["state"] == "aborted" or r["step_label"] == "gate" else None

        def compared() -> float:
            text = http.get(f"{p.url}/metrics").text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("switchyard_shadow_comparisons_total{")
            )

        client = p.client()
        sent = 0
        for prompt in prompts:
            for stream in (False, True):
                if decided():
                    break
                raw = client.chat.completions.with_raw_response.create(
                    model="smollm2", messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=8, stream=stream
                )
                assert raw.headers["x-switchyard-backend"] == "llama"
                parsed = raw.parse()
                if stream:
                    "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
                sent += 1
                # Its copy is judged, or the release has decided (an abort stops the copies).
                poll("the copy's comparison", lambda n=sent: compared() >= n or decided(), p.proc, timeout=REQUEST_TIMEOUT_S)
        verdict = poll("the release's verdict", decided, p.proc, timeout=REQUEST_TIMEOUT_S)
        if verdict["state"] != "aborted":
            http.post(f"http://{admin}/admin/releases/{rid}/abort", json={"reason": "test over"})

    # The pairs the release judged, as the comparator judges them.
    comparison = json.loads(run_switchyard("report", "--comparisons", "--include-cold", "--format", "json", "--ledger", str(db)))
    differs = any(g["counts"]["mismatch"] for g in comparison["groups"])
    assert (verdict["state"] == "aborted") == differs, (verdict, comparison["groups"])
    if differs:
        assert "comparable pairs differ; first: request " in verdict["waiting_for"], verdict
        assert " the answers part: primary " in verdict["waiting_for"], verdict
        texts = sqlite3.connect(db).execute("SELECT primary_text, candidate_text FROM comparisons WHERE verdict = 'mismatch'").fetchall()
        assert texts and all(p_text and c_text and p_text != c_text for p_text, c_text in texts), texts

    # The same requests through `switchyard compare`, a run of its own on the same two engines:
    # every workload the release judged gets the same verdict there (cold and warm together).
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(
        json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 8, **({"stream": True} if stream else {})}) + "\n"
        for prompt in prompts
        for stream in (False, True)
    ))
    compare_config = tmp_path / "compare.toml"
    compare_config.write_text(base_config(engines) + f'\n[ledger]\npath = "{tmp_path / "compare.db"}"\n')
    compared_again = json.loads(run_switchyard(
        "compare", "--config", str(compare_config), "--suite", str(suite), "--primary", "llama", "--candidate", "mlx",
        "--repeat", "1", "--include-cold", "--format", "json",
    ))

    def verdicts(report: dict) -> dict:
        """Per workload and transport, whether its answers differed; pairs that could not be
        compared (a copy stopped by the abort) judge nothing."""
        out: dict = {}
        for g in report["groups"]:
            if g["counts"]["match"] or g["counts"]["mismatch"]:
                key = (g["workload"], g["streamed"])
                out[key] = out.get(key, False) or bool(g["counts"]["mismatch"])
        return out

    judged, again = verdicts(comparison), verdicts(compared_again)
    assert judged and set(judged) <= set(again), (judged, again)
    assert all(again[key] == differs_there for key, differs_there in judged.items()), (judged, again)
    if verdict["state"] != "aborted":
        assert not any(again.values()), again


def test_every_answer_after_the_first_ready_carries_a_verified_identity(engines: Engines, tmp_path: Path) -> None:
    """Switchyard and a llama-server started together: as soon as `/readyz` first says 200,
    twenty requests sent at once are all answered with the engine's build and the artifact's
    verified digest — none stamped `unknown` because a probe or a hash had not finished."""
    import concurrent.futures

    port = free_port()
    config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 5000

[backends.llama]
engine = "llama.cpp"
url = "http://127.0.0.1:{port}"
artifact = "{engines.gguf}"
binary = "{engines.llama_bin}"

[models.smollm2]
primary = "llama"
"""
    path = tmp_path / "switchyard.toml"
    path.write_text(config)
    proxy = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(path)], tmp_path / "switchyard.log")
    llama = Proc(
        "llama-server-cold",
        [str(engines.llama_bin), "-m", str(engines.gguf), "-c", "2048", "-np", "4", "--host", "127.0.0.1", "--port", str(port)],
        tmp_path / "llama-server-cold.log",
    )
    try:
        url = proxy.wait_for_line(r"switchyard listening on (http://127\.0\.0\.1:\d+)").group(1)
        seen: list[int] = []

        def ready() -> bool:
            seen.append(http.get(f"{url}/readyz").status_code)
            return seen[-1] == 200

        with http_client(timeout=5.0) as http:
            poll("switchyard's readiness", ready, proxy)
        assert 503 in seen, "ready before the engine could have loaded"

        def ask(i: int) -> httpx.Response:
            body = {"model": "smollm2", "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 4, "temperature": 0}
            return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=REQUEST_TIMEOUT_S)

        with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(ask, range(20)))
        digest = "sha256:" + sha256_file(engines.gguf)
        build = httpx.get(f"http://127.0.0.1:{port}/props", timeout=5.0).json()["build_info"]
        # A build without a version names itself by its binary's digest.
        engine = "llama.cpp/" + ("sha256:" + sha256_file(engines.llama_bin) if build == "b0-unknown" else build)
        for a in answers:
            assert a.status_code == 200, a.text
            assert a.headers["x-switchyard-artifact"] == digest, a.headers
            assert a.headers["x-switchyard-engine"] == engine, a.headers
    finally:
        proxy.stop()
        llama.stop()


def test_init_writes_a_config_that_serves_both_engines(engines: Engines, tmp_path: Path) -> None:
    """`switchyard init` pointed at the running llama-server and mlx_lm.server identifies each,
    fills in the artifact each names, and writes a configuration that `switchyard check`
    accepts and that serves both, verified. Asked to set up Claude Code, it gives the
    llama-server's model (the engine that serves the Messages API) every other name, and says
    how to point Claude Code at it."""
    out = tmp_path / "conf" / "switchyard.toml"
    printed = run_switchyard(
        "init", "--no-scan", "--engine", engines.mlx_url, "--engine", engines.llama_url, "--output", str(out),
        "--agent", "claude-code",
    )
    assert f"at {engines.llama_url}" in printed and f"at {engines.mlx_url}" in printed, printed
    assert "export ANTHROPIC_BASE_URL=http://" in printed, printed
    text = out.read_text()
    assert 'engine = "llama.cpp"' in text and 'engine = "mlx"' in text, text
    run_switchyard("check", "--config", str(out))
    proxy = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(out), "--listen", "127.0.0.1:0"], tmp_path / "switchyard.log")
    try:
        url = proxy.wait_for_line(r"switchyard listening on (http://127\.0\.0\.1:\d+)").group(1)
        with http_client(timeout=REQUEST_TIMEOUT_S) as http:
            poll("switchyard", lambda: http.get(f"{url}/readyz").status_code == 200, proxy)
            models = [m["id"] for m in http.get(f"{url}/v1/models").json()["data"]]
            assert len(models) == 2, models
            backends = set()
            for model in models:
                body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
                answer = http.post(f"{url}/v1/chat/completions", json=body)
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-switchyard-artifact"].startswith("sha256:"), answer.headers
                backends.add(answer.headers["x-switchyard-backend"])
            assert backends == {"llama", "mlx"}
            # A name no model has, as Claude Code sends it, reaches llama-server.
            body = {"model": "claude-opus-5-5", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
            answer = http.post(f"{url}/v1/messages", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-switchyard-backend"] == "llama", answer.headers
            assert answer.headers["x-switchyard-model-pattern"] == "*", answer.headers
    finally:
        proxy.stop()


def test_the_dashboard_shows_both_engines_their_phases_and_the_shadow_verdicts(engines: Engines, tmp_path: Path) -> None:
    """The dashboard (/ui) in chromium, after real traffic to llama-server with every request
    shadowed to mlx_lm.server: both backends with the identities the admin API gives, the phase
    chart with bars drawn, the comparator's verdicts (a mismatch side by side and without a
    ratio), and the live tail updated from the event stream. No console error."""
    from ui_check import console_problems, run_check

    db = tmp_path / "ledger.db"
    tokens = tmp_path / "admin-tokens"
    token = run_switchyard("admin", "token", "add", "ops", "--tokens", str(tokens)).strip()
    admin = f"http://127.0.0.1:{free_port()}"
    config = shadow_config(engines, db, "mlx") + f'\n[admin]\nlisten = "{admin.removeprefix("http://")}"\ntokens = "{tokens}"\n'
    # A release that holds at its first step (it needs far more requests than are sent).
    config += '\n[plans.quarter]\nevaluate_every_ms = 500\nsteps = [{ step = "live", weight = 25, min_requests = 100000 }]\n'
    auth = {"authorization": f"Bearer {token}"}
    with start_switchyard(tmp_path, config, identities_known) as p:
        sent = shadowed_requests(p, ["What is the capital of France? Answer in one sentence."], 2, 8)
        p.client().chat.completions.create(model="smollm2-mlx", messages=PROMPT, temperature=0, max_tokens=8)
        with http_client(timeout=10.0) as http:
            # /metrics counts a comparison before the ledger's writer commits it: the page reads
            # the ledger, so wait until the admin API's answer has every pair.
            def pairs() -> bool:
                groups = http.get(f"{admin}/admin/comparisons", headers=auth).json()["groups"]
                return sum(g["counts"]["pairs"] for g in groups) >= sent

            poll("comparisons in the ledger", pairs, p.proc, timeout=30)
            backends = http.get(f"{admin}/admin/backends", headers=auth).json()["backends"]
            comparisons = http.get(f"{admin}/admin/comparisons", headers=auth).json()["groups"]
            started = http.post(f"{admin}/admin/releases", headers=auth, json={"model": "smollm2-mlx", "candidate": "llama", "plan": "quarter"})
            assert started.status_code == 201, started.text
            release = started.json()
            # Evaluated at least once (a hold) before the page is read.
            poll("an evaluation", lambda: http.get(f"{admin}/admin/releases/{release['id']}", headers=auth).json()["evaluations"], p.proc, timeout=30)
            result = run_check("real-engines", {"mode": "real", "admin": admin, "client": p.url, "token": token, "model": "smollm2"})

    assert result["page_status"] == 200
    assert result["login"]["status"] == 401 and result["login"]["opened"], result["login"]
    assert result["login"]["stored"] == {"session": True, "local": 0}
    assert console_problems(result) == [], console_problems(result)
    assert all(not e for e in result["view_errors"].values()), result["view_errors"]

    # Both backends, with the engine build and artifact digest the admin API gives, verified.
    shown = {e["backend"]: e for e in result["engines"]}
    assert set(shown) == {"llama", "mlx"}, shown
    for name, e in shown.items():
        # The build shortened on the card, whole in its title.
        assert e["engine_title"] == backends[name]["engine"], (e, backends[name])
        assert e["artifact"] == backends[name]["artifact"] and e["artifact"].startswith("sha256:"), e
        assert "verified" in e["shown"] and e["state"] == "ready", e

    # The model overview: each model with its engines by role, as configured.
    overview = {m["model"]: m for m in result["models"]}
    assert [(r["backend"], r["role"]) for r in overview["smollm2"]["roles"]] == [("llama", "primary"), ("mlx", "shadow")], overview
    assert [(r["backend"], r["role"]) for r in overview["smollm2-mlx"]["roles"]] == [("mlx", "primary"), ("llama", "candidate")], overview

    # The release: running at 25%, its one transition shown, its evaluations hidden by default.
    assert [(r["id"], r["state"], r["weight"]) for r in result["releases"]] == [(release["id"], "running", "25%")], result["releases"]
    assert result["releases"][0]["events"] == 1 and result["releases"][0]["evaluations"] == 0, result["releases"]
    assert all(r["state"] == "ready" for m in overview.values() for r in m["roles"]), overview

    # The phase chart: for every row, its parts add up to its total (within the page's
    # rounding) and fill its bar; ttfb overlaps prefill and is never one of the parts.
    for row in result["bars"]:
        parts = sum(s["ms"] for s in row["segments"])
        assert abs(parts - row["total"]) <= 0.001 * len(row["segments"]) + 1e-9, row
        drawn_width = sum(s["width"] for s in row["segments"])
        assert abs(drawn_width - row["width"]) <= 2 * len(row["segments"]), row
    drawn = {b["group"]: b["segments"] for b in result["bars"]}
    for backend in ("llama", "mlx"):
        segments = [s for group, segs in drawn.items() if f" · {backend} · " in group for s in segs]
        assert segments and all(s["ms"] > 0 and s["width"] > 0 for s in segments), (backend, drawn)
        phases = {s["phase"] for s in segments}
        assert "decode" in phases and "ttfb" not in phases, (backend, drawn)
    assert result["charts"] > 0

    # The shadow verdicts, as the comparator grouped them; a mismatch is shown side by side,
    # never with a ratio.
    assert len(result["comparisons"]) == len(comparisons) > 0, result["comparisons"]
    for page_group, api_group in zip(result["comparisons"], comparisons):
        assert page_group["status"] == api_group["status"]
        counts = {k: v for k, v in api_group["counts"].items() if k != "pairs" and v}
        assert sorted(page_group["verdicts"]) == sorted(f"{k.replace('_', '-')} {v}" for k, v in counts.items())
        if api_group["counts"]["mismatch"]:
            assert len(page_group["side_by_side"]) == 2 and not page_group["ratios"], page_group

    # The live tail: a request sent while the page was open appeared from the event stream.
    assert result["live_status"] == 200 and result["tail_rows"] > 0
    assert "llama" in result["live_row"] and "smollm2" in result["live_row"], result["live_row"]
    assert result["filtered_variants"] == ["shadow"], result["filtered_variants"]
