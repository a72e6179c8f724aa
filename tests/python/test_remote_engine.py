"""An engine on another host, as reached in practice: the real llama-server behind an HTTPS
reverse proxy that mounts it under `/llama`, with a certificate from a private CA that
Switchyard trusts through `ca_file`. Switchyard verifies the engine's identity through the proxy
and serves the same greedy answers as the engine does directly, whole and streamed.

The reverse proxy is a small one written here (one request per connection, `Connection: close`
upstream); the certificates are made with the `openssl` command (tests/run installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from conftest import Proc, http_client
from test_real_engines import (
    REQUEST_TIMEOUT_S,
    free_port,
    identities_settled,
    poll,
    required_path,
    sha256_file,
    start_switchyard,
)

PROMPT = [{"role": "user", "content": "Name three primary colors."}]
MAX_TOKENS = 16


def make_certificates(workdir: Path) -> tuple[Path, Path, Path]:
    """A private CA, and a certificate for `localhost` it signed: (ca.pem, cert.pem, key.pem)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed: run the suite through tests/run, which installs it", pytrace=False)
    ca_key, ca, key, csr, cert = (workdir / n for n in ("ca.key", "ca.pem", "key.pem", "cert.csr", "cert.pem"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *args: subprocess.run([openssl, *args], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=Switchyard test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    extensions = workdir / "leaf.ext"
    extensions.write_text(
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(extensions))
    return ca, cert, key


class TlsReverseProxy:
    """HTTPS on a free port, forwarding what is under `prefix` to `upstream` without it (one
    request per connection); records the paths it forwarded."""

    def __init__(self, upstream_port: int, prefix: str, cert: Path, key: Path) -> None:
        self.upstream_port = upstream_port
        self.prefix = prefix
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.paths: list[str] = []
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> TlsReverseProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.listen(), self.loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def listen(self) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0, ssl=self.context)
        self.port = server.sockets[0].getsockname()[1]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            request_line, *fields = [line for line in head.split("\r\n") if line]
            method, target, _ = request_line.split(" ")
            length = 0
            for field in fields:
                name, _, value = field.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            if not target.startswith(self.prefix + "/"):
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            path = target[len(self.prefix):]
            self.paths.append(path)
            kept = [f for f in fields if f.split(":", 1)[0].strip().lower() not in ("host", "connection")]
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            up_writer.write(
                (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.upstream_port}\r\nConnection: close\r\n"
                 + "".join(f + "\r\n" for f in kept) + "\r\n").encode("latin-1") + body
            )
            await up_writer.drain()
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            up_writer.close()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


@contextlib.contextmanager
def llama_server(workdir: Path) -> Iterator[tuple[str, Path, Path, Proc]]:
    llama_bin = required_path("LLAMA_SERVER_BIN")
    gguf = required_path("SMOLLM2_GGUF")
    port = free_port()
    proc = Proc(
        "llama-server",
        [str(llama_bin), "-m", str(gguf), "-c", "2048", "--host", "127.0.0.1", "--port", str(port)],
        workdir / "llama-server.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        with http_client(timeout=5.0) as http:
            poll("llama-server", lambda: http.get(f"{url}/health").status_code == 200, proc)
        yield url, llama_bin, gguf, proc
    finally:
        proc.stop()


def answer(client: openai.OpenAI, stream: bool) -> str:
    if stream:
        chunks = client.chat.completions.create(
            model="smollm2", messages=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model="smollm2", messages=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    return reply.choices[0].message.content or ""


def test_llama_server_behind_an_https_reverse_proxy_with_a_private_ca(tmp_path: Path) -> None:
    ca, cert, key = make_certificates(tmp_path)
    with llama_server(tmp_path) as (engine_url, llama_bin, gguf, _), TlsReverseProxy(
        int(engine_url.rsplit(":", 1)[1]), "/llama", cert, key
    ) as tls:
        config = f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 200
first_byte_timeout_ms = 120000

[backends.remote]
engine = "llama.cpp"
url = "https://localhost:{tls.port}/llama"
ca_file = "{ca}"
artifact = "{gguf}"
binary = "{llama_bin}"
require_verified_identity = true

[models.smollm2]
primary = "remote"
"""
        with start_switchyard(tmp_path, config, identities_settled("remote")) as proxy:
            direct = openai.OpenAI(
                base_url=f"{engine_url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0
            )
            expected = answer(direct, stream=False)
            assert expected, "the engine answered nothing"
            through = proxy.client()
            for _ in range(3):
                for stream in (False, True):
                    assert answer(through, stream) == expected
            # The identity every answer carries was verified through the proxy.
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:
                r = http.post(
                    f"{proxy.url}/v1/chat/completions",
                    json={"model": "smollm2", "messages": PROMPT, "max_tokens": 4},
                )
                assert r.status_code == 200, r.text
                assert r.headers["x-switchyard-artifact"] == f"sha256:{sha256_file(gguf)}"
                assert r.headers["x-switchyard-engine"].startswith("llama.cpp/")
                assert r.headers["x-switchyard-backend"] == "remote"
            # Every request and probe went under the prefix, which the reverse proxy took off.
            assert "/v1/chat/completions" in tls.paths
            assert "/props" in tls.paths
