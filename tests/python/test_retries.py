"""The official openai SDK's retries, as Switchyard's answers steer them: a 504 after a
first-byte timeout says `x-should-retry: false` and is tried once, not three times; a 503 for
an engine whose start failed says `Retry-After: 1` and is retried after a second."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from conftest import ADDRESS, Proc, binary


@contextlib.contextmanager
def switchyard(workdir: Path, body: str) -> Iterator[str]:
    path = workdir / "switchyard.toml"
    path.write_text(
        f"""
[server]
listen = "127.0.0.1:0"
probe_interval_ms = 100
first_byte_timeout_ms = 300
state_dir = {json.dumps(str(workdir / "state"))}
{body}
[models.smollm2]
primary = "engine"
"""
    )
    proc = Proc("switchyard", [str(binary("SWITCHYARD_BIN", "switchyard")), "serve", "--config", str(path)], workdir / "switchyard.log")
    try:
        yield proc.wait_for_line(r"switchyard listening on " + ADDRESS).group(1)
    finally:
        proc.stop()


def counting_client(url: str, sent: list[float]) -> openai.OpenAI:
    """The SDK with its default retries; every HTTP request it sends is noted."""
    hooks = {"request": [lambda _request: sent.append(time.monotonic())]}
    return openai.OpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        timeout=30.0,
        http_client=openai.DefaultHttpxClient(trust_env=False, event_hooks=hooks),
    )


CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def test_a_first_byte_timeout_is_not_retried(tmp_path: Path) -> None:
    engine = Proc(
        "fake-engine",
        [str(binary("FAKE_ENGINE_BIN", "fake-engine")), "--listen", "127.0.0.1:0", "--prefill-ms", "2000"],
        tmp_path / "fake-engine.log",
    )
    try:
        url = engine.wait_for_line(r"fake-engine listening on " + ADDRESS).group(1)
        backend = f'[backends.engine]\nengine = "llama.cpp"\nurl = "{url}"\n'
        with switchyard(tmp_path, backend) as base:
            sent: list[float] = []
            with pytest.raises(openai.InternalServerError) as caught:
                counting_client(base, sent).chat.completions.create(**CHAT)
            assert caught.value.status_code == 504
            assert caught.value.response.headers["x-should-retry"] == "false"
            assert len(sent) == 1, f"the SDK sent it {len(sent)} times"
    finally:
        engine.stop()


def test_a_failed_engine_start_is_retried_after_a_second(tmp_path: Path) -> None:
    backend = """
[backends.engine]
engine = "llama.cpp"
[backends.engine.launch]
command = ["sh", "-c", "echo 'cannot load the model' >&2; exit 3", "${port}"]
"""
    with switchyard(tmp_path, backend) as base:
        sent: list[float] = []
        with pytest.raises(openai.APIStatusError) as caught:
            counting_client(base, sent).chat.completions.create(**CHAT)
        assert caught.value.status_code == 503
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.response.headers["x-should-retry"] == "true"
        assert caught.value.body["code"] == "engine_start_failed", caught.value.body
        # Two retries (the SDK's default), each at least the second it was told to wait.
        assert len(sent) == 3, sent
        assert all(b - a >= 1.0 for a, b in zip(sent, sent[1:])), sent
