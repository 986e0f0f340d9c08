"""OpenAI's routes under /v1, driven by the official `openai` client against a real server: the demo's text
models (common/repository/demo_text.py), `echo` (a decoupled Python model that streams its prompt back) and
`embed` (WordLlama's tokenizer and ONNX encoder as an ensemble, from the wordllama package's shipped files)."""
from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from ringserve.common.repository.demo_text import build_echo_model, build_embed_models, wordllama_folder

from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.integration

API_KEY = "openai-routes-key"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("openai")
    build_echo_model(repo, token_delay_ms=50)
    build_echo_model(repo, "plain", chat_template=False)
    build_embed_models(repo, wordllama_folder())
    key_file = repo / "api-key"
    key_file.write_text(API_KEY)
    with running_stack(repo, "--api-key-file", str(key_file)) as s:
        yield s


@pytest.fixture(scope="module")
def client(stack: Stack):
    with openai.OpenAI(base_url=stack.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60) as c:
        yield c


def reference_vectors(texts: list[str]) -> np.ndarray:
    """The wordllama package's own encode, in this process, from the files it ships (its WordLlama.load() looks
    for the tokenizer in a folder the wheel does not have, then downloads it: the wheel's folder is given as
    its cache)."""
    from wordllama import WordLlama

    return WordLlama.load(cache_dir=Path(wordllama_folder()), disable_download=True).embed(texts, norm=True)


def test_the_client_lists_the_models_and_reads_one(client: openai.OpenAI):
    listed = client.models.list()

    assert [m.id for m in listed.data] == ["echo", "embed", "plain", "wordllama_encoder", "wordllama_tokenizer"]
    assert all(m.object == "model" and m.owned_by == "ringserve" and m.created > 0 for m in listed.data)
    assert client.models.retrieve("embed").id == "embed"


def test_a_completion_is_the_models_text_with_the_usage_it_counted(client: openai.OpenAI):
    done = client.completions.create(model="echo", prompt="one two three four five", max_tokens=3)

    assert done.object == "text_completion" and done.model == "echo"
    assert done.choices[0].text == "one two three" and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (5, 3, 8)


def test_a_streamed_completion_comes_a_token_at_a_time_as_the_model_sends_them(client: openai.OpenAI):
    arrivals, texts = [], []
    stream = client.completions.create(
        model="echo", prompt="alpha beta gamma delta", max_tokens=10, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        arrivals.append(time.monotonic())
        texts.append(chunk.choices[0].text if chunk.choices else chunk.usage)

    assert texts[:4] == ["alpha", " beta", " gamma", " delta"] and texts[4] == ""
    assert (texts[5].prompt_tokens, texts[5].completion_tokens) == (4, 4)
    # echo sleeps 50 ms before each token: the last came well after the first (nothing was held back).
    assert arrivals[3] - arrivals[0] > 0.1


def test_the_stream_is_openais_server_sent_events_ending_with_done(stack: Stack):
    body = {"model": "echo", "prompt": "a b", "stream": True}
    with httpx.stream("POST", stack.url + "/v1/completions", json=body,
                      headers={"authorization": f"Bearer {API_KEY}"}, timeout=30) as r:
        raw = b"".join(r.iter_bytes())

    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events) and events[-1] == b"data: [DONE]" and len(events) == 4


def test_chat_messages_reach_the_model_through_its_chat_template(client: openai.OpenAI):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]

    whole = client.chat.completions.create(model="echo", messages=messages, max_tokens=50)
    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(model="echo", messages=messages, max_tokens=50, stream=True)
              if c.choices]

    # echo answers its prompt's words: the prompt is what echo's tokenizer_config.json chat template made.
    templated = "<|im_start|>system be brief<|im_end|> <|im_start|>user hello there<|im_end|> <|im_start|>assistant"
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content == templated
    assert whole.object == "chat.completion" and whole.choices[0].finish_reason == "stop"
    assert "".join(pieces) == templated


def test_a_model_without_a_chat_template_gets_the_documented_default(client: openai.OpenAI):
    done = client.chat.completions.create(
        model="plain", messages=[{"role": "user", "content": "hi"}], max_tokens=50
    )

    assert done.choices[0].message.content == "user: hi assistant:"


def test_embeddings_are_the_wordllama_packages_own_vectors(client: openai.OpenAI):
    texts = ["The cat sat on the mat.", "ringserve serves models", "a", "Ünïcödé text, too"]

    listed = client.embeddings.create(model="embed", input=texts)
    one = client.embeddings.create(model="embed", input=texts[0], encoding_format="base64")

    expected = reference_vectors(texts)
    got = np.array([d.embedding for d in sorted(listed.data, key=lambda d: d.index)], dtype=np.float32)
    assert got.shape == (4, 256)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)
    assert listed.usage.prompt_tokens > len(texts) and listed.usage.total_tokens == listed.usage.prompt_tokens
    raw = one.data[0].embedding
    vector = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else np.array(raw, np.float32)
    np.testing.assert_allclose(vector, expected[0], rtol=0, atol=2e-6)


def test_errors_come_in_openais_shape_with_their_status(stack: Stack, client: openai.OpenAI):
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="echo", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError) as not_text:
        client.completions.create(model="wordllama_encoder", prompt="x")
    with pytest.raises(openai.BadRequestError) as not_embedding:
        client.embeddings.create(model="echo", input="x")
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="wrong", max_retries=0) as stranger, \
            pytest.raises(openai.AuthenticationError) as refused:
        stranger.models.list()

    assert unknown.value.status_code == 404 and unknown.value.code == "model_not_found"
    assert bad.value.body["param"] == "n" and bad.value.body["type"] == "invalid_request_error"
    assert "text_input" in not_text.value.message and not_embedding.value.body["param"] == "model"
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    r = httpx.get(stack.url + "/v1/nothing", headers={"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
