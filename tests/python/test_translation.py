"""The agent APIs on engines that speak only chat completions (issue 61): Anthropic's Messages API
and OpenAI's Responses API served through chat completions — the request translated to its chat
form, the answer (whole and streamed) translated back — with the official SDKs, against the REAL
engines:

- mlx_lm.server, which has neither API: `messages.create`, `messages.stream`, `responses.create`
  and `responses.stream` each answer, stamped `x-switchyard-translated` with the engine's verified
  identity, and say what the engine's own chat answer says (greedy);
- llama-server told to translate (`agent_apis = "translate"`) beside the same llama-server served
  natively: for greedy requests, text and tool round trips, streamed and not, the translated
  answers equal llama-server's own Messages and Responses answers as the SDKs read them, which
  proves the translation rather than the engine.

The ledger keeps both paths: the client's (`path`) and the engine's (`engine_path`).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Iterator

import anthropic
import openai
import pytest

from test_agent_endpoints import (
    TOOL_CALL_TOKENS,
    TOOLS_TEMPLATE,
    WEATHER,
    anthropic_client,
    messages_input,
    openai_client,
    responses_input,
)
from test_real_engines import (  # noqa: F401 - the fixtures are used by name
    DETERMINISTIC_LLAMA,
    PROMPT,
    Engines,
    Proxy,
    base_config,
    engines,
    identities_known,
    second_llama_server,
    sha256_dir,
    start_switchyard,
)

QUESTION = PROMPT[0]["content"]
RESPONSES_TOOL = {"type": "function", "name": WEATHER["name"], "description": WEATHER["description"],
                  "parameters": WEATHER["schema"]}
MESSAGES_TOOL = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["schema"]}


@pytest.fixture(scope="module")
def translating(engines: Engines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proxy, Path]]:
    """Switchyard with a ledger, in front of the module's engines and of a second llama-server
    (a chat template that renders tools, one slot, no prompt cache: greedy answers that depend
    on nothing but the request) served twice: natively (`smollm2-tools`) and translated
    (`smollm2-tools-translated`)."""
    workdir = tmp_path_factory.mktemp("translation")
    db = workdir / "ledger.db"
    template = ("--chat-template-file", str(TOOLS_TEMPLATE))
    with second_llama_server(engines, workdir, *DETERMINISTIC_LLAMA, *template, name="llama-tools") as url:
        config = base_config(engines) + f"""
[backends.tools]
engine = "llama.cpp"
url = "{url}"
artifact = "{engines.gguf}"
binary = "{engines.llama_bin}"

[backends.tools-translated]
engine = "llama.cpp"
url = "{url}"
artifact = "{engines.gguf}"
binary = "{engines.llama_bin}"
agent_apis = "translate"

[models.smollm2-tools]
primary = "tools"

[models.smollm2-tools-translated]
primary = "tools-translated"

[ledger]
path = "{db}"
"""

        def ready(r: dict) -> bool:
            return identities_known(r) and all(
                r["backends"][b]["identity"] == "verified" for b in ("tools", "tools-translated"))

        with start_switchyard(workdir, config, ready) as p:
            yield p, db


def assert_mlx_translated(engines: Engines, headers, how: str) -> None:  # noqa: ANN001
    assert headers["x-switchyard-translated"] == how
    assert headers["x-switchyard-backend"] == "mlx"
    assert headers["x-switchyard-artifact"] == "sha256:" + sha256_dir(engines.mlx_dir)
    assert headers["x-switchyard-engine"].startswith("mlx/")
    assert not headers["x-switchyard-engine"].endswith("/unknown")


#: Room for the whole one-sentence answer, so that it ends on its own (`end_turn`, `completed`):
#: the openai SDK's `responses.stream` finishes only on `response.completed`.
ANSWER_TOKENS = 64


def mlx_chat_answer(proxy: Proxy) -> tuple[str, int]:
    """The engine's own greedy chat answer through Switchyard, and its completion tokens."""
    r = openai_client(proxy).chat.completions.create(
        model="smollm2-mlx", messages=PROMPT, temperature=0, max_tokens=ANSWER_TOKENS)
    assert r.choices[0].finish_reason == "stop", ("the answer must end within the limit", r)
    return r.choices[0].message.content, r.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_mlx_serves_the_messages_api_through_chat(engines: Engines, translating: tuple[Proxy, Path], stream: bool) -> None:
    proxy, _ = translating
    expected, tokens = mlx_chat_answer(proxy)
    client = anthropic_client(proxy)
    # This SDK takes no `temperature` argument; the API still does.
    kwargs = {"model": "smollm2-mlx", "max_tokens": ANSWER_TOKENS, "messages": PROMPT, "extra_body": {"temperature": 0}}
    if stream:
        with client.messages.stream(**kwargs) as s:
            deltas = "".join(s.text_stream)
            message = s.get_final_message()
            headers = s.response.headers
        assert deltas == message.content[0].text
    else:
        raw = client.messages.with_raw_response.create(**kwargs)
        message, headers = raw.parse(), raw.headers
    assert_mlx_translated(engines, headers, "messages>chat")
    assert message.role == "assistant" and message.type == "message"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == expected
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == tokens
    assert message.usage.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_mlx_serves_the_responses_api_through_chat(engines: Engines, translating: tuple[Proxy, Path], stream: bool) -> None:
    proxy, _ = translating
    expected, tokens = mlx_chat_answer(proxy)
    client = openai_client(proxy)
    kwargs = {"model": "smollm2-mlx", "input": QUESTION, "temperature": 0, "max_output_tokens": ANSWER_TOKENS,
              "store": False}
    if stream:
        with client.responses.stream(**kwargs) as s:
            deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
            response = s.get_final_response()
        assert deltas == response.output_text
        # The stream's head, through the raw events.
        raw = client.responses.with_raw_response.create(**kwargs, stream=True)
        headers = raw.headers
        kinds = [e.type for e in raw.parse()]
        assert kinds[:2] == ["response.created", "response.in_progress"], kinds
        assert kinds[-1] == "response.completed", kinds
    else:
        raw = client.responses.with_raw_response.create(**kwargs)
        response, headers = raw.parse(), raw.headers
    assert_mlx_translated(engines, headers, "responses>chat")
    assert response.output_text == expected
    assert response.status == "completed"
    assert response.usage.output_tokens == tokens
    assert response.usage.input_tokens > 0


def test_the_ledger_keeps_the_clients_path_and_the_engines(translating: tuple[Proxy, Path]) -> None:
    proxy, db = translating
    client = anthropic_client(proxy)
    raw = client.messages.with_raw_response.create(model="smollm2-mlx", max_tokens=4, messages=PROMPT)
    request_id = raw.headers["x-request-id"]
    tokens = client.messages.count_tokens(model="smollm2-mlx", messages=PROMPT)
    assert tokens.input_tokens > 0

    def row() -> tuple | None:
        with sqlite3.connect(db) as conn:
            return conn.execute(
                "SELECT path, engine_path, backend, status, completion_tokens FROM requests WHERE request_id = ?",
                (request_id,)).fetchone()

    from test_real_engines import poll
    found = poll("the request's ledger row", row, proxy.proc)
    assert found == ("/v1/messages", "/v1/chat/completions", "mlx", 200, 4)


def messages_answer(client: anthropic.Anthropic, model: str, stream: bool, **kwargs) -> tuple:  # noqa: ANN003
    kwargs = {"model": model, "extra_body": {"temperature": 0}, **kwargs}
    if stream:
        with client.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = client.messages.create(**kwargs)
    blocks = [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in message.content]
    return blocks, message.stop_reason, message.usage.output_tokens


def responses_answer(client: openai.OpenAI, model: str, stream: bool, **kwargs) -> tuple:  # noqa: ANN003
    kwargs = {"model": model, "temperature": 0, **kwargs}
    if stream:
        # The final response as its last event carries it: llama-server's own Responses stream
        # opens its message item without `content`, which the SDK's `responses.stream` cannot
        # accumulate (the translated one can: see the MLX test above).
        events = list(client.responses.create(**kwargs, stream=True))
        response = events[-1].response
        assert events[-1].type == "response.completed", events[-1]
    else:
        response = client.responses.create(**kwargs)
    items = []
    for item in response.output:
        if item.type == "message":
            items.append(("message", "".join(c.text for c in item.content if c.type == "output_text")))
        elif item.type == "function_call":
            items.append(("function_call", item.name, json.loads(item.arguments)))
    return items, response.status, response.usage.output_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_translated_llama_server_answers_as_its_own_apis_do(translating: tuple[Proxy, Path], stream: bool) -> None:
    proxy, _ = translating
    anthropic_sdk, openai_sdk = anthropic_client(proxy), openai_client(proxy)
    cases = {
        "messages, text": lambda model: messages_answer(
            anthropic_sdk, model, stream, max_tokens=ANSWER_TOKENS, messages=PROMPT, system="Be brief."),
        "messages, tool": lambda model: messages_answer(
            anthropic_sdk, model, stream, max_tokens=TOOL_CALL_TOKENS, messages=messages_input(),
            tools=[MESSAGES_TOOL], tool_choice={"type": "any"}),
        "responses, text": lambda model: responses_answer(
            openai_sdk, model, stream, input=QUESTION, instructions="Be brief.", max_output_tokens=ANSWER_TOKENS),
        "responses, tool": lambda model: responses_answer(
            openai_sdk, model, stream, input=responses_input(), tools=[RESPONSES_TOOL], tool_choice="required",
            max_output_tokens=TOOL_CALL_TOKENS),
    }
    for name, ask in cases.items():
        native = ask("smollm2-tools")
        translated = ask("smollm2-tools-translated")
        assert translated == native, name
        if name.endswith("tool"):
            # The round trip's call: the model was shown two calls and makes the third.
            assert any(part[0] in ("tool_use", "function_call") and part[2] == {"city": "Paris"}
                       for part in native[0]), (name, native)
