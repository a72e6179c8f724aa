"""Client keys through the official openai SDK: the key made by `switchyard keys add` works as
`api_key=`, and a wrong one raises `openai.AuthenticationError` (401, nothing retried)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from conftest import ADDRESS, MODEL, READY_POLL_S, READY_TIMEOUT_S, REQUEST_TIMEOUT_S, Proc, binary, child_env, http_client


@contextlib.contextmanager
def keyed_stack(workdir: Path) -> Iterator[tuple[str, str]]:
    """A fake engine and a Switchyard whose [auth] holds one key, `agent`: yields the base URL
    and the key, once the backend is ready."""
    switchyard_bin = binary("SWITCHYARD_BIN", "switchyard")
    with contextlib.ExitStack() as cleanup:
        engine = Proc(
            "fake-engine",
            [str(binary("FAKE_ENGINE_BIN", "fake-engine")), "--listen", "127.0.0.1:0", "--tokens", "4"],
            workdir / "fake-engine.log",
        )
        cleanup.callback(engine.stop)
        engine_url = engine.wait_for_line(r"fake-engine listening on " + ADDRESS).group(1)
        config = workdir / "switchyard.toml"
        config.write_text(
            f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100

[backends.fake]
engine = "llama.cpp"
url = {json.dumps(engine_url)}

[models.{MODEL}]
primary = "fake"
"""
        )
        added = subprocess.run(
            [str(switchyard_bin), "keys", "add", "agent", "--config", str(config)],
            capture_output=True,
            text=True,
            env=child_env(),
            check=True,
        )
        key = added.stdout.strip()
        assert key.startswith("sy-"), added
        assert key not in config.read_text(), "only the key's digest is stored"
        proxy = Proc("switchyard", [str(switchyard_bin), "serve", "--config", str(config)], workdir / "switchyard.log")
        cleanup.callback(proxy.stop)
        url = proxy.wait_for_line(r"switchyard listening on " + ADDRESS).group(1)
        deadline = time.monotonic() + READY_TIMEOUT_S
        with http_client(base_url=url, timeout=2.0) as http:
            while http.get("/readyz", headers={"authorization": f"Bearer {key}"}).json().get("ready") is not True:
                assert time.monotonic() < deadline, "not ready: " + proxy.describe()
                time.sleep(READY_POLL_S)
        yield url, key


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=key,
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
        http_client=openai.DefaultHttpxClient(trust_env=False),
    )


def test_the_sdks_api_key_is_a_client_key_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    with keyed_stack(tmp_path) as (url, key):
        with sdk(url, key) as client:
            completion = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert completion.choices[0].message.content
            chunks = list(
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
                )
            )
            assert chunks, "the stream carried chunks"
            assert [m.id for m in client.models.list()] == [MODEL]

        with sdk(url, "sy-" + "0" * 64) as wrong:
            with pytest.raises(openai.AuthenticationError) as refused:
                wrong.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 401
        assert refused.value.code == "invalid_api_key"
        assert refused.value.type == "invalid_request_error"
        assert "sy-000" not in str(refused.value), "the key presented is never quoted back"
