"""Switchyard through the official OpenAI Python SDK, against the fake llama-server.

What a real client sees: routing by model and alias, streaming that matches non-streaming, the
identity headers, the `: switchyard {...}` stream trailer, OpenAI-shaped errors, `/v1/models`.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest

from conftest import ALIAS, BACKEND, MODEL, Stack

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three rivers of Europe."},
]
PROMPT = "The three longest rivers of Europe are"
MAX_TOKENS = 32

WORKLOAD = re.compile(r"wl:[0-9a-f]{32}")
TRAILER_PREFIX = ": switchyard "


def chat_text(client: openai.OpenAI, model: str = MODEL, messages: list | None = None) -> str:
    completion = client.chat.completions.create(
        model=model, messages=messages or MESSAGES, temperature=0, max_tokens=MAX_TOKENS
    )
    assert len(completion.choices) == 1, completion
    content = completion.choices[0].message.content
    assert isinstance(content, str) and content.strip(), completion
    return content


def sse_lines(raw: str) -> list[str]:
    """The stream's lines, CRLF or LF, blank lines (event separators) dropped."""
    return [line for line in raw.replace("\r\n", "\n").split("\n") if line.strip()]


def check_trailer(raw: str) -> dict:
    """Exactly one `: switchyard {...}` comment, its own SSE event, right before `data: [DONE]`,
    which ends the stream. Returns the comment's JSON."""
    text = raw.replace("\r\n", "\n")
    lines = sse_lines(text)
    comments = [i for i, line in enumerate(lines) if line.startswith(TRAILER_PREFIX + "{")]
    assert len(comments) == 1, f"expected one switchyard comment, got {len(comments)}:\n{raw}"
    (at,) = comments
    assert lines[at + 1 :] == ["data: [DONE]"], f"comment not right before a final [DONE]:\n{raw}"
    assert f"\n\n{lines[at]}\n\ndata: [DONE]" in text, f"comment is not its own SSE event:\n{raw}"
    assert text.endswith("data: [DONE]\n\n"), f"stream does not end with [DONE] and a blank line:\n{raw!r}"
    trailer = json.loads(lines[at][len(TRAILER_PREFIX) :])
    assert isinstance(trailer, dict), trailer
    total = trailer["server_timing"]["total"]
    assert isinstance(total, (int, float)) and total >= 0, trailer
    assert isinstance(trailer["output"], str) and trailer["output"].startswith("sha256:"), trailer
    return trailer


# --- chat completions --------------------------------------------------------------------------


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_chat_via_alias_matches_model(client: openai.OpenAI) -> None:
    by_model = chat_text(client, MODEL)
    by_alias = chat_text(client, ALIAS)
    assert by_alias == by_model


def test_chat_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    expected = chat_text(client)
    parts: list[str] = []
    chunks = 0
    finish_reasons = []
    with client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, stream=True
    ) as stream:
        for chunk in stream:
            chunks += 1
            assert chunk.object == "chat.completion.chunk", chunk
            for choice in chunk.choices:
                if choice.delta.content:
                    parts.append(choice.delta.content)
                if choice.finish_reason:
                    finish_reasons.append(choice.finish_reason)
    assert chunks > 1, "a stream of one chunk is not streaming"
    assert "".join(parts) == expected
    assert finish_reasons and finish_reasons[-1] in ("stop", "length")


# --- text completions --------------------------------------------------------------------------


def test_completions_streaming_equals_non_streaming(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS
    )
    assert len(completion.choices) == 1, completion
    expected = completion.choices[0].text
    assert expected.strip(), completion

    parts: list[str] = []
    with client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS, stream=True
    ) as stream:
        for chunk in stream:
            for choice in chunk.choices:
                parts.append(choice.text or "")
    assert "".join(parts) == expected


def test_completions_via_alias(client: openai.OpenAI) -> None:
    a = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS)
    b = client.completions.create(model=ALIAS, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS)
    assert b.choices[0].text == a.choices[0].text != ""


# --- identity headers and the stream trailer ---------------------------------------------------


def check_identity_headers(headers: httpx.Headers, stack: Stack, streamed: bool = False) -> None:
    assert headers.get("x-request-id"), dict(headers)
    assert headers.get("x-switchyard-backend") == BACKEND, dict(headers)
    engine = headers.get("x-switchyard-engine", "")
    assert engine.startswith("llama.cpp/") and len(engine) > len("llama.cpp/"), dict(headers)
    assert headers.get("x-switchyard-artifact") == "sha256:" + stack.artifact_sha256, dict(headers)
    assert headers.get("x-switchyard-variant") == "primary", dict(headers)
    assert WORKLOAD.fullmatch(headers.get("x-switchyard-workload", "")), dict(headers)
    timing = headers.get("server-timing", "")
    if streamed:
        # Headers leave before the stream ends: the total is in the `: switchyard` trailer.
        assert "ttfb;dur=" in timing, dict(headers)
    else:
        assert "total;dur=" in timing, dict(headers)


def test_identity_headers_on_raw_response(client: openai.OpenAI, stack: Stack) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
    )
    assert raw.status_code == 200
    check_identity_headers(raw.headers, stack)
    completion = raw.parse()
    assert completion.choices[0].message.content


def test_readyz_reports_verified_identity(http: httpx.Client, stack: Stack) -> None:
    response = http.get("/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["ready"] is True
    backend = body["backends"][BACKEND]
    assert backend["identity"] == "verified", backend
    assert backend["artifact"] == "sha256:" + stack.artifact_sha256, backend
    assert backend["engine"].startswith("llama.cpp/"), backend


def test_chat_stream_trailer(client: openai.OpenAI, stack: Stack) -> None:
    non_streamed = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
    )
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, stream=True
    ) as response:
        assert response.status_code == 200
        assert response.headers.get("content-type", "").startswith("text/event-stream")
        check_identity_headers(response.headers, stack, streamed=True)
        raw = b"".join(response.iter_bytes()).decode("utf-8")
    check_trailer(raw)
    # `stream` does not change the work: the workload fingerprint is the same either way.
    assert response.headers["x-switchyard-workload"] == non_streamed.headers["x-switchyard-workload"]
    # The streamed text (data events only) equals the non-streamed content.
    text = ""
    for line in sse_lines(raw):
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[len("data: ") :])["choices"]:
                text += choice.get("delta", {}).get("content") or ""
    assert text == non_streamed.parse().choices[0].message.content


def test_completions_stream_trailer_raw_httpx(http: httpx.Client, stack: Stack) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        check_identity_headers(response.headers, stack, streamed=True)
        raw = response.read().decode("utf-8")
    check_trailer(raw)


# --- errors and models -------------------------------------------------------------------------


def test_unknown_model_is_not_found_then_service_continues(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="no-such-model", messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
        )
    error = info.value
    assert error.status_code == 404
    assert isinstance(error.body, dict), error.body
    assert MODEL in error.body["message"], error.body
    assert "no-such-model" in error.body["message"], error.body
    assert error.code == "model_not_found"
    assert error.param == "model"
    assert error.type == "invalid_request_error"
    assert error.response.headers.get("x-request-id")

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=MAX_TOKENS)

    # The proxy is unharmed.
    assert chat_text(client)


def test_models_list(client: openai.OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert MODEL in ids, ids
