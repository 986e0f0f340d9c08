"""A worker killed (SIGKILL) while it streams OpenAI completions: each stream ends, none hangs. A stream that had
sent tokens ends with an error event (what was sent is not sent again); one that had sent nothing is run again on
the restarted worker and completes; the requests of other models are served throughout."""
from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from ringserve.common.repository.demo_text import build_echo_model, build_embed_models, wordllama_folder

from tests.support.stack import poll_for

pytestmark = pytest.mark.chaos

WORDS = "w1 w2 w3 w4 w5 w6 w7 w8"


def read_stream(client: openai.OpenAI, prompt: str, delay_ms: int) -> tuple[list[str], Exception | None]:
    """The texts of a streamed completion as they came, and the error that ended it (None: it completed)."""
    texts: list[str] = []
    try:
        stream = client.completions.create(model="echo", prompt=prompt, max_tokens=20, stream=True,
                                           extra_body={"token_delay_ms": delay_ms})
        texts += [chunk.choices[0].text for chunk in stream if chunk.choices]
    except openai.APIError as exc:
        return texts, exc
    return texts, None


def test_a_worker_killed_mid_stream_ends_its_streams_and_every_other_request_is_served(start_stack, tmp_path: Path):
    build_echo_model(tmp_path)
    build_embed_models(tmp_path, wordllama_folder())
    stack = start_stack(tmp_path)
    lane = stack.lane("echo")
    pid = stack.worker_pid(lane)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=120)
    sent: list[str] = []
    with ThreadPoolExecutor(8) as pool:
        # Its first token comes 3 s after it runs: the kill below finds it with nothing sent.
        quiet = pool.submit(read_stream, client, "late answer", 3000)
        embeddings = [pool.submit(client.embeddings.create, model="embed", input=f"text {k}") for k in range(16)]
        with pytest.raises(openai.APIError) as broken:
            for chunk in client.completions.create(model="echo", prompt=WORDS, max_tokens=8, stream=True,
                                                   extra_body={"token_delay_ms": 200}):
                sent.append(chunk.choices[0].text)
                if len(sent) == 2:
                    os.kill(pid, signal.SIGKILL)
        after = [pool.submit(client.embeddings.create, model="embed", input=f"after {k}") for k in range(16)]

        assert sent == ["w1", " w2"]  # sent before the kill, and not sent again
        assert "died (SIGKILL) after 2 response(s)" in broken.value.message
        assert quiet.result(timeout=120) == (["late", " answer", ""], None)  # run again, whole
        assert all(len(f.result(timeout=120).data[0].embedding) == 256 for f in embeddings + after)
    poll_for(lambda: stack.serves("echo") and stack.worker_pid(lane) != pid, 30, what="echo's new worker")
    assert read_stream(client, "served again", 5) == (["served", " again", ""], None)
    client.close()
