"""The endpoints agents use besides chat, through Switchyard to the REAL llama-server: OpenAI's
Responses API with the official openai SDK (`client.responses.create`, streamed and not) and
Anthropic's Messages API with the official anthropic SDK, each stamped like chat (engine and
artifact identity verified) with its phases; the errors as the Anthropic SDK reads them; the paths without `/v1`; `server.default_model`.

The engines and the proxy are the fixtures of test_real_engines.py (one llama-server and one
mlx_lm.server per module, Switchyard in front with `require_verified_identity` on both).

A stream's phases travel in its end-of-stream comment (`: switchyard {...}`), which SDKs skip:
the SDKs here read through a transport that keeps a copy of every byte, so the test reads the
comment the SDK passed over.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import anthropic
import httpx
import httpx2
import openai
import pytest

from conftest import http_client
from test_real_engines import (  # noqa: F401 - the fixtures are used by name
    MAX_TOKENS,
    PROMPT,
    REQUEST_TIMEOUT_S,
    Engines,
    Proxy,
    base_config,
    engines,
    identities_known,
    proxy,
    server_timing,
    sha256_file,
    start_switchyard,
)

QUESTION = PROMPT[0]["content"]
#: Room for a tool call in the XML form of tests/prompts/chatml-tools.jinja (about 36 tokens).
TOOL_CALL_TOKENS = 64


def tee_transport(http_module):  # noqa: ANN001, ANN201
    """A transport of `http_module` (httpx for openai, httpx2 for anthropic) that keeps each
    response's headers and every byte of its body as the SDK reads it."""

    class Tee(http_module.BaseTransport):
        def __init__(self) -> None:
            self.inner = http_module.HTTPTransport()
            self.seen: list[tuple[dict, list[bytes]]] = []

        def handle_request(self, request):  # noqa: ANN001, ANN201
            response = self.inner.handle_request(request)
            chunks: list[bytes] = []
            self.seen.append((dict(response.headers), chunks))
            upstream = response.stream

            class Recorded(http_module.SyncByteStream):
                def __iter__(self):  # noqa: ANN204
                    for chunk in upstream:
                        chunks.append(chunk)
                        yield chunk

                def close(self) -> None:
                    upstream.close()

            return http_module.Response(
                status_code=response.status_code,
                headers=response.headers,
                stream=Recorded(),
                extensions=response.extensions,
            )

        def close(self) -> None:
            self.inner.close()

        def last(self) -> tuple[dict, str]:
            headers, chunks = self.seen[-1]
            return headers, b"".join(chunks).decode()

    return Tee()


def openai_client(proxy: Proxy, tee=None, base: str = "/v1") -> openai.OpenAI:  # noqa: ANN001
    return openai.OpenAI(
        base_url=f"{proxy.url}{base}",
        api_key="unused",
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
        http_client=openai.DefaultHttpxClient(transport=tee or httpx.HTTPTransport(), trust_env=False),
    )


def anthropic_client(proxy: Proxy, tee=None) -> anthropic.Anthropic:  # noqa: ANN001
    return anthropic.Anthropic(
        base_url=proxy.url,
        api_key="unused",
        max_retries=0,
        timeout=REQUEST_TIMEOUT_S,
        http_client=anthropic.DefaultHttpxClient(transport=tee or httpx2.HTTPTransport(), trust_env=False),
    )


def assert_llama_identity(engines: Engines, headers) -> None:  # noqa: ANN001
    """Stamped like chat: the llama backend, its binary's or build's identity, the GGUF's digest."""
    assert headers["x-switchyard-backend"] == "llama"
    assert headers["x-switchyard-variant"] == "primary"
    assert headers["x-switchyard-artifact"] == "sha256:" + sha256_file(engines.gguf)
    build = httpx.get(f"{engines.llama_url}/props", trust_env=False).json()["build_info"]
    if build == "b0-unknown":
        assert headers["x-switchyard-engine"] == "llama.cpp/sha256:" + sha256_file(engines.llama_bin)
    else:
        assert headers["x-switchyard-engine"] == "llama.cpp/" + build
    assert headers["x-switchyard-workload"].startswith("wl:")


def comment_of(text: str) -> tuple[dict, list[str]]:
    """The end-of-stream comment's JSON, and the SSE blocks of the stream in order."""
    blocks = [b for b in text.split("\n\n") if b]
    comment = next(b for b in blocks if b.startswith(": switchyard "))
    return json.loads(comment[len(": switchyard "):]), blocks


def test_responses_whole_with_the_openai_sdk(engines: Engines, proxy: Proxy) -> None:
    raw = openai_client(proxy).responses.with_raw_response.create(
        model="smollm2", input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS
    )
    response = raw.parse()
    assert response.output_text.strip(), "the engine answered nothing"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert_llama_identity(engines, raw.headers)
    st = server_timing(raw.headers["server-timing"])
    assert 0 < st["ttfb"] <= st["total"]
    # llama-server reports no timings on a whole Responses answer: none is invented.
    assert "prefill" not in st and "decode" not in st
    direct = openai.OpenAI(base_url=f"{engines.llama_url}/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    expected = direct.responses.create(model="anything", input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS)
    assert response.output_text == expected.output_text


def test_responses_streamed_with_the_openai_sdk(engines: Engines, proxy: Proxy) -> None:
    tee = tee_transport(httpx)
    stream = openai_client(proxy, tee).responses.create(
        model="smollm2", input=QUESTION, temperature=0, max_output_tokens=MAX_TOKENS, stream=True
    )
    deltas, completed = [], None
    for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert "".join(deltas).strip(), "no text streamed"
    assert completed is not None and completed.usage.output_tokens > 0
    headers, text = tee.last()
    assert_llama_identity(engines, headers)
    comment, blocks = comment_of(text)
    # The comment comes right after response.completed, which carries llama-server's timings.
    at = next(i for i, b in enumerate(blocks) if b.startswith(": switchyard "))
    assert blocks[at - 1].startswith("event: response.completed")
    timings = json.loads(blocks[at - 1].split("data: ", 1)[1])["timings"]
    st = comment["server_timing"]
    assert st["prefill"] == round(timings["prompt_ms"], 3)
    assert st["decode"] == round(timings["predicted_ms"], 3)
    assert 0 < st["ttft"] <= st["total"]
    assert comment["usage"]["output_tokens"] == completed.usage.output_tokens
    assert "[DONE]" not in text


def test_messages_whole_with_the_anthropic_sdk(engines: Engines, proxy: Proxy) -> None:
    raw = anthropic_client(proxy).messages.with_raw_response.create(
        model="smollm2", max_tokens=MAX_TOKENS, messages=PROMPT, extra_body={"temperature": 0}
    )
    message = raw.parse()
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.usage.output_tokens > 0
    assert_llama_identity(engines, raw.headers)
    st = server_timing(raw.headers["server-timing"])
    assert 0 < st["ttfb"] <= st["total"]


def test_messages_streamed_with_the_anthropic_sdk(engines: Engines, proxy: Proxy) -> None:
    tee = tee_transport(httpx2)
    with anthropic_client(proxy, tee).messages.stream(
        model="smollm2", max_tokens=MAX_TOKENS, messages=PROMPT, extra_body={"temperature": 0}
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip(), "no text streamed"
    assert final.usage.output_tokens > 0
    headers, raw = tee.last()
    assert_llama_identity(engines, headers)
    comment, blocks = comment_of(raw)
    at = next(i for i, b in enumerate(blocks) if b.startswith(": switchyard "))
    assert blocks[at - 1].startswith("event: message_stop")
    st = comment["server_timing"]
    # llama-server sends no timings on the Messages API: decode is measured, prefill absent.
    assert st.get("measured") is True
    assert "prefill" not in st
    assert 0 < st["ttft"] <= st["total"] and st["decode"] >= 0
    # The usage the SDK assembled is the one the comment carries.
    assert comment["usage"]["output_tokens"] == final.usage.output_tokens
    assert comment["usage"]["input_tokens"] == final.usage.input_tokens


def test_count_tokens_with_the_anthropic_sdk(engines: Engines, proxy: Proxy) -> None:
    raw = anthropic_client(proxy).messages.with_raw_response.count_tokens(model="smollm2", messages=PROMPT)
    assert raw.parse().input_tokens > 0
    assert_llama_identity(engines, raw.headers)


def test_the_anthropic_sdk_reads_switchyards_errors(proxy: Proxy) -> None:
    client = anthropic_client(proxy)
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="gpt-4", max_tokens=4, messages=PROMPT)
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "not_found_error"
    assert err.value.body["error"]["code"] == "model_not_found"
    # A block the chat form has no place for, on mlx_lm.server (which is served the Messages
    # API through chat completions): refused before anything reaches it.
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="smollm2-mlx", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    assert err.value.body["error"]["code"] == "untranslatable_request"
    assert "document" in err.value.body["error"]["message"]
    assert err.value.response.headers["x-switchyard-backend"] == "mlx"


def test_rerank_and_infill_reach_llama_server(proxy: Proxy) -> None:
    """Passed through and stamped; this llama-server runs without `--reranking` and SmolLM2 has
    no fill-in-the-middle tokens, so the engine's own refusal (501) is what comes back."""
    with http_client(base_url=proxy.url, timeout=REQUEST_TIMEOUT_S) as http:
        for path, body in [
            ("/v1/rerank", {"model": "smollm2", "query": "capital of France", "documents": ["Paris", "Lyon"]}),
            ("/infill", {"model": "smollm2", "input_prefix": "def add(a, b):\n", "input_suffix": "\n"}),
        ]:
            r = http.post(path, json=body)
            assert r.status_code == 501, (path, r.text)
            assert r.json()["error"]["type"] == "not_supported_error"
            assert r.headers["x-switchyard-backend"] == "llama"


def test_the_paths_without_v1_with_the_openai_sdk(engines: Engines, proxy: Proxy) -> None:
    client = openai_client(proxy, base="")
    raw = client.chat.completions.with_raw_response.create(model="smollm2", messages=PROMPT, temperature=0, max_tokens=4)
    assert raw.parse().choices[0].message.content
    assert_llama_identity(engines, raw.headers)
    assert {m.id for m in client.models.list()} == {"smollm2", "smollm2-mlx"}


def test_a_request_without_model_goes_to_the_default(engines: Engines, tmp_path: Path) -> None:
    config = base_config(engines).replace("[server]\n", '[server]\ndefault_model = "smollm2"\n', 1)
    with start_switchyard(tmp_path, config, identities_known) as p:
        with http_client(base_url=p.url, timeout=REQUEST_TIMEOUT_S) as http:
            r = http.post("/v1/chat/completions", json={"messages": PROMPT, "temperature": 0, "max_tokens": 4})
            assert r.status_code == 200, r.text
            assert r.headers["x-switchyard-model-defaulted"] == "true"
            assert_llama_identity(engines, r.headers)
            r = http.post("/v1/messages", json={"messages": PROMPT, "max_tokens": 4})
            assert r.status_code == 200, r.text
            assert r.headers["x-switchyard-model-defaulted"] == "true"
    with start_switchyard(tmp_path, base_config(engines), identities_known) as p:
        r = httpx.post(f"{p.url}/v1/chat/completions", json={"messages": PROMPT, "max_tokens": 4}, trust_env=False)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "missing_model"
        assert "x-switchyard-model-defaulted" not in r.headers


WEATHER = {"name": "get_weather", "description": "The weather of a city",
           "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
#: A chat template that renders tools and that llama-server parses tool calls from (SmolLM2's
#: own renders no tools, so the model never sees them).
TOOLS_TEMPLATE = Path(__file__).resolve().parents[1] / "prompts" / "chatml-tools.jinja"
#: Two earlier turns in which the assistant called the tool: SmolLM2-135M, shown the tools
#: alone, answers in prose for as long as it may; shown two calls, it makes the third.
EARLIER_CITIES = ("London", "Rome")
QUESTION_OF = "What is the weather in {}?".format


def responses_input() -> list[dict]:
    items: list[dict] = []
    for n, city in enumerate(EARLIER_CITIES):
        items.append({"role": "user", "content": QUESTION_OF(city)})
        items.append({"type": "function_call", "call_id": f"call_{n}", "name": WEATHER["name"],
                      "arguments": json.dumps({"city": city})})
    return items + [{"role": "user", "content": QUESTION_OF("Paris")}]


def messages_input() -> list[dict]:
    messages: list[dict] = []
    for n, city in enumerate(EARLIER_CITIES):
        messages.append({"role": "user", "content": QUESTION_OF(city)})
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{n}", "name": WEATHER["name"], "input": {"city": city}}]})
    return messages + [{"role": "user", "content": QUESTION_OF("Paris")}]


def chat_input() -> list[dict]:
    messages: list[dict] = []
    for n, city in enumerate(EARLIER_CITIES):
        messages.append({"role": "user", "content": QUESTION_OF(city)})
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": WEATHER["name"], "arguments": json.dumps({"city": city})}}]})
    return messages + [{"role": "user", "content": QUESTION_OF("Paris")}]


def chat_answer(answer, stream: bool) -> tuple[str, str, list[tuple[str, object]]]:  # noqa: ANN001
    """Content, finish reason and tool calls of a chat answer, whole or assembled from its chunks."""
    if not stream:
        choice = answer.choices[0]
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        return choice.message.content or "", choice.finish_reason, calls
    content, finish, parts = "", None, {}
    for chunk in answer:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                name, arguments = parts.get(call.index, ("", ""))
                parts[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
    return content, finish, [(name, json.loads(arguments)) for _, (name, arguments) in sorted(parts.items())]


def output_hash(content: str, finish_reason: str, calls: list[tuple[str, object]]) -> str:
    """The comparator's output hash of a one-choice answer, computed here from what the SDK
    returned (adapters/src/fingerprint/output.rs documents the form): one line of canonical
    JSON, then SHA-256."""
    line = json.dumps(
        {"content": content.replace("\r\n", "\n").rstrip(), "finish_reason": finish_reason, "index": 0,
         "tool_calls": [{"arguments": arguments, "name": name} for name, arguments in calls]},
        sort_keys=True, separators=(",", ":"), ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256((line + "\n").encode()).hexdigest()


def test_shadowed_responses_and_messages_are_compared_with_the_sdks(engines: Engines, tmp_path: Path) -> None:
    """Issue 44: chat, Codex-style (Responses) and Claude-style (Messages) traffic, with tool
    calls, is shadowed between two llama-servers on the same GGUF (a chat template that renders tools)
    and compared like chat: each request gives a pair judged `match`, and the output both sides
    are recorded with is the hash of what the SDK read (the tool call's name and arguments, the
    stop reason), so the tool call is what was compared."""
    import sqlite3

    from test_real_engines import DETERMINISTIC_LLAMA, second_llama_server, shadow_config, wait_comparisons

    db = tmp_path / "ledger.db"
    template = ("--chat-template-file", str(TOOLS_TEMPLATE))
    with (
        second_llama_server(engines, tmp_path, *DETERMINISTIC_LLAMA, *template, name="llama-tools-1") as url1,
        second_llama_server(engines, tmp_path, *DETERMINISTIC_LLAMA, *template, name="llama-tools-2") as url2,
    ):
        config = shadow_config(engines, db, "llama2", url2).replace(f'url = "{engines.llama_url}"', f'url = "{url1}"')
        with start_switchyard(tmp_path, config, lambda r: identities_known(r) and r["backends"]["llama2"]["identity"] == "verified") as p:
            openai_sdk, anthropic_sdk = openai_client(p), anthropic_client(p)
            tool = {"type": "function", "name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["schema"]}
            anthropic_tool = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["schema"]}
            expected = []
            for stream in (False, True):
                answer = openai_sdk.chat.completions.create(
                    model="smollm2", messages=chat_input(), tools=[{"type": "function", "function": {
                        "name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["schema"]}}],
                    tool_choice="required", temperature=0, max_tokens=TOOL_CALL_TOKENS, stream=stream,
                )
                content, finish, calls = chat_answer(answer, stream)
                assert calls == [(WEATHER["name"], {"city": "Paris"})], (content, finish)
                expected.append(output_hash(content, finish, calls))
                wait_comparisons(p, len(expected))

                response = openai_sdk.responses.create(
                    model="smollm2", input=responses_input(), tools=[tool], tool_choice="required", temperature=0,
                    max_output_tokens=TOOL_CALL_TOKENS, stream=stream,
                )
                if stream:
                    response = next(e.response for e in response if e.type == "response.completed")
                calls = [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]
                assert calls == [(WEATHER["name"], {"city": "Paris"})], response.output
                expected.append(output_hash(response.output_text, response.status, calls))
                wait_comparisons(p, len(expected))

                kwargs = {"model": "smollm2", "max_tokens": TOOL_CALL_TOKENS, "tools": [anthropic_tool],
                          "tool_choice": {"type": "any"}, "extra_body": {"temperature": 0}, "messages": messages_input()}
                if stream:
                    with anthropic_sdk.messages.stream(**kwargs) as s:
                        message = s.get_final_message()
                else:
                    message = anthropic_sdk.messages.create(**kwargs)
                calls = [(b.name, b.input) for b in message.content if b.type == "tool_use"]
                assert calls == [(WEATHER["name"], {"city": "Paris"})], message.content
                text = "".join(b.text for b in message.content if b.type == "text")
                expected.append(output_hash(text, message.stop_reason, calls))
                wait_comparisons(p, len(expected))
    rows = sqlite3.connect(db).execute(
        "SELECT r.path, c.streamed, c.verdict, c.reason, c.primary_output, c.candidate_output, c.mode "
        "FROM comparisons c JOIN requests r ON r.request_id = c.primary_request_id ORDER BY c.id"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        (path, streamed) for streamed in (0, 1) for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages")
    ], rows
    for (path, _, verdict, reason, primary, candidate, mode), hashed in zip(rows, expected):
        assert verdict == "match" and mode == "after-primary", (path, verdict, reason)
        assert primary == candidate == hashed, (path, primary, candidate, hashed)


def test_sampled_claude_and_codex_traffic_is_replayed_to_mlx_and_judged(engines: Engines, tmp_path: Path) -> None:
    """Issue 44: agents sample, and speak the Messages and Responses APIs, which mlx_lm.server
    does not serve. Shadowed from llama-server to mlx_lm.server with replays and the
    equivalence rule on, each such request (sampled, or greedy to an API the candidate lacks)
    is replayed greedily in its chat form to both engines and judged: a pair with a verdict,
    never `incomparable`. The live requests stay the clients' own (their paths, variant
    primary); the replays are chat completions of variant `replay` on both engines."""
    import sqlite3

    from test_real_engines import shadow_config, wait_comparisons

    db = tmp_path / "ledger.db"
    rule = "replay = { max_tokens = 16 }, equivalence = { near_tie_logprob = 1.0, min_same_top = 0.85, max_mean_kl = 0.1 }"
    config = shadow_config(engines, db, "mlx").replace("max_in_flight = 1 }", f"max_in_flight = 1, {rule} }}")
    assert rule in config
    with start_switchyard(tmp_path, config, identities_known) as p:
        openai_sdk, anthropic_sdk = openai_client(p), anthropic_client(p)
        sent = 0
        for temperature, stream in ((0.7, False), (0.7, True), (0, False)):
            kwargs = {"model": "smollm2", "max_tokens": 16, "system": "Answer in one short sentence.",
                      "messages": [{"role": "user", "content": QUESTION}], "extra_body": {"temperature": temperature}}
            if stream:
                with anthropic_sdk.messages.stream(**kwargs) as s:
                    s.get_final_message()
            else:
                anthropic_sdk.messages.create(**kwargs)
            sent += 1
            wait_comparisons(p, sent)
        for stream in (False, True):
            response = openai_sdk.responses.create(
                model="smollm2", instructions="Answer in one short sentence.", input=QUESTION,
                temperature=0.7, max_output_tokens=16, stream=stream,
            )
            if stream:
                for _ in response:
                    pass
            sent += 1
            wait_comparisons(p, sent)
    con = sqlite3.connect(db)
    # A replay's pair names the replay's own requests (chat completions on both engines).
    rows = con.execute(
        "SELECT r.path, c.mode, c.verdict, c.reason, c.candidate_backend, c.candidate_engine "
        "FROM comparisons c JOIN requests r ON r.request_id = c.primary_request_id ORDER BY c.id"
    ).fetchall()
    assert len(rows) == sent, rows
    for path, mode, verdict, reason, candidate, engine in rows:
        assert path == "/v1/chat/completions" and mode == "replay", (path, mode, reason)
        assert candidate == "mlx" and engine.startswith("mlx/"), (candidate, engine)
        assert verdict in ("match", "equivalent", "mismatch"), (verdict, reason)
    replays = con.execute(
        "SELECT backend, count(*) FROM requests WHERE variant = 'replay' AND path = '/v1/chat/completions' GROUP BY backend"
    ).fetchall()
    # Each MLX side is primed first (its prompt cached, as the other side's is): a primer and
    # the replay itself.
    assert sorted(replays) == [("llama", sent), ("mlx", 2 * sent)], replays
    live = con.execute("SELECT path FROM requests WHERE variant = 'primary' ORDER BY id").fetchall()
    assert [r[0] for r in live] == ["/v1/messages"] * 3 + ["/v1/responses"] * 2, live
    # The MLX engine was never sent an API it lacks.
    assert con.execute("SELECT count(*) FROM requests WHERE backend = 'mlx' AND path != '/v1/chat/completions'").fetchone()[0] == 0
