"""The OpenAI-compatible routes: /v1/models, /v1/models/{model}, /v1/completions, /v1/chat/completions
and /v1/embeddings (the package's __init__ says how a request maps onto a model).

A streamed completion waits for the model's first response before it answers: an error before it (an unknown
model, a bad input, 503 while no worker is ready) is a plain error answer with its status; one after it (the
worker died mid-stream: StreamBroken) ends the stream with an `{"error": ...}` event, and no `[DONE]`.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.errors import GatewayError, status_of
from ringserve.gateway.kserve.dataplane import DataPlane
from ringserve.gateway.observe.access import current_request_id, request_id_of
from ringserve.gateway.openai import mapping
from ringserve.gateway.openai.chat import chat_prompt
from ringserve.gateway.openai.errors import InvalidField, openai_error_body
from ringserve.gateway.openai.requests import Generation, load_json, read_chat, read_completion, read_embedding
from ringserve.gateway.openai.stream import DONE_EVENT, ClientWatch, EventStream, Responses, error_event, event

OWNED_BY = "ringserve"
STARTED_S = int(time.time())  # a model's `created`: when this gateway started serving

ReadBody = Callable[[Any, bytes | None], Awaitable[bytes]]
Outputs = dict[str, np.ndarray]


def openai_error(exc: GatewayError) -> Response:
    return Response(openai_error_body(exc), status_of(exc), headers=exc.headers, media_type="application/json")


def ok(doc: Any) -> Response:
    return Response(orjson.dumps(doc), 200, media_type="application/json")


class OpenAIEndpoints:
    """The /v1 routes of one gateway, over its data plane; `read_body` is the HTTP layer's body reader (its
    limits: --max-request-bytes, --body-timeout-s)."""

    def __init__(self, plane: DataPlane | None, read_body: ReadBody, watch: ClientWatch) -> None:
        self.plane = cast(DataPlane, plane)  # None: only routes() is called
        self.read_body = read_body
        self.watch = watch

    def routes(self) -> list[Route]:
        return [
            Route("/v1/models", self.list_models),
            Route("/v1/models/{model}", self.get_model),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/embeddings", self.embeddings, methods=["POST"]),
        ]

    # -- models -----------------------------------------------------------------------------------------
    async def list_models(self, request: Request) -> Response:
        return ok({"object": "list", "data": [_model_doc(name) for name in sorted(self.plane.configs)]})

    async def get_model(self, request: Request) -> Response:
        try:
            config = self.plane.lookup(request.path_params["model"], None)
        except GatewayError as exc:
            return openai_error(exc)
        return ok(_model_doc(config.name))

    # -- completions ------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        try:
            body = await self._body(request)
            generation = (read_chat if chat else read_completion)(load_json(body))
        except GatewayError as exc:
            return openai_error(exc)
        responses = self._start(
            request, generation.model, len(body), lambda config: _generation_doc(config, generation, chat)
        )
        if isinstance(responses, Response):
            return responses
        answer = Answer(generation, chat, responses.call.request_id)
        stream = aiter(responses)
        try:
            first = await anext(stream, None)
        except GatewayError as exc:
            responses.close(exc, request.url.path, 0)
            return openai_error(exc)
        if not generation.stream:
            return await self._whole(request, responses, answer, first, stream)
        return EventStream(self._events(request, responses, answer, first, stream))

    async def _whole(
        self,
        request: Request,
        responses: Responses,
        answer: Answer,
        first: Outputs | None,
        stream: AsyncIterator[Outputs],
    ) -> Response:
        try:
            if first is not None:
                answer.add(first)
                async for outputs in stream:
                    answer.add(outputs)
        except GatewayError as exc:
            responses.close(exc, request.url.path, 0)
            return openai_error(exc)
        body = orjson.dumps(answer.whole())
        responses.close(None, request.url.path, len(body))
        return Response(body, 200, media_type="application/json")

    async def _events(
        self,
        request: Request,
        responses: Responses,
        answer: Answer,
        first: Outputs | None,
        stream: AsyncIterator[Outputs],
    ) -> AsyncIterator[bytes]:
        failure: GatewayError | None = None
        sent = 0
        try:
            if answer.chat:
                yield event(answer.chunk({"role": "assistant", "content": ""}))
            outputs = first
            while outputs is not None:
                piece = answer.add(outputs)
                if piece:
                    chunk = event(answer.chunk({"content": piece} if answer.chat else piece))
                    sent += len(chunk)
                    yield chunk
                outputs = await anext(stream, None)
            yield event(answer.chunk({} if answer.chat else "", answer.finish_reason()))
            if answer.generation.include_usage:
                yield event({**answer.chunk({} if answer.chat else "", None), "choices": [], "usage": answer.usage()})
            yield DONE_EVENT
        except GatewayError as exc:
            failure = exc
            yield error_event(exc)
        finally:
            responses.close(failure, request.url.path, sent)

    # -- embeddings -------------------------------------------------------------------------------------
    async def embeddings(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            wanted = read_embedding(load_json(body))
        except GatewayError as exc:
            return openai_error(exc)
        started = [self._start(request, wanted.model, len(text), _embedding_doc(text)) for text in wanted.texts]
        failed = next((r for r in started if isinstance(r, Response)), None)
        running = [r for r in started if isinstance(r, Responses)]
        outcomes = await asyncio.gather(*(_last(r, request.url.path) for r in running), return_exceptions=True)
        if failed is not None:
            return failed
        answers: list[Outputs] = []
        for outcome in outcomes:
            if isinstance(outcome, GatewayError):
                return openai_error(outcome)
            if isinstance(outcome, BaseException):
                raise outcome
            answers.append(outcome)
        config = running[0].config
        data, counts = [], []
        for index, outputs in enumerate(answers):
            vector = mapping.vector_of(config, outputs)
            if wanted.dimensions is not None and wanted.dimensions != vector.size:
                why = f"model {config.name!r} answers {vector.size} dimensions, not {wanted.dimensions}"
                return openai_error(InvalidField("dimensions", why))
            data.append({"object": "embedding", "index": index, "embedding": _encoded(vector, wanted.encoding_format)})
            counts.append(mapping.count_of(outputs, mapping.INPUT_TOKENS))
        doc: dict[str, Any] = {"object": "list", "data": data, "model": config.name}
        known = [c for c in counts if c is not None]
        if len(known) == len(counts):  # (usage only where the model counts every text's tokens)
            doc["usage"] = {"prompt_tokens": sum(known), "total_tokens": sum(known)}
        return ok(doc)

    # -- the data plane ---------------------------------------------------------------------------------
    def _start(
        self, request: Request, model: str, size: int, make_doc: Callable[[ModelConfig], dict]
    ) -> Responses | Response:
        """The request started through the data plane, or the error answer that stopped it first."""
        plane = self.plane
        call = plane.begin(model, current_request_id.get() or request_id_of(None), request.scope["headers"], "http")
        try:
            config = plane.target(call, model, None, "OpenAI's routes", streaming=True)
            return Responses(plane, call, config, make_doc(config), size, request.receive, self.watch)
        except GatewayError as exc:
            status = plane.failed(call, exc)
            plane.finish(call, status, "POST", request.url.path, 0, status)
            return openai_error(exc)

    async def _body(self, request: Request) -> bytes:
        length = next((value for name, value in request.scope["headers"] if name == b"content-length"), None)
        return await self.read_body(request.receive, length)


async def _last(responses: Responses, path: str) -> Outputs:
    try:
        outcomes = await responses.collect()
    except GatewayError as exc:
        responses.close(exc, path, 0)
        raise
    responses.close(None, path, 0)
    return outcomes[-1]


class Answer:
    """A completion's text and usage as its responses come, and the documents that carry them."""

    def __init__(self, generation: Generation, chat: bool, request_id: str) -> None:
        self.generation, self.chat = generation, chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + (request_id or uuid.uuid4().hex)
        self.created = int(time.time())
        self.pieces: list[str] = []
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def add(self, outputs: dict[str, np.ndarray]) -> str:
        """One response's outputs: its piece of the text (returned) and its token counts."""
        piece = mapping.text_of(outputs)
        self.pieces.append(piece)
        prompt = mapping.count_of(outputs, mapping.INPUT_TOKENS)
        if prompt is not None and self.prompt_tokens is None:
            self.prompt_tokens = prompt
        produced = mapping.count_of(outputs, mapping.OUTPUT_TOKENS)
        if produced is not None:  # (each response counts its own tokens, as Triton's frontend sums them)
            self.completion_tokens = (self.completion_tokens or 0) + produced
        return piece

    def usage(self) -> dict[str, int] | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        total = self.prompt_tokens + self.completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens, "total_tokens": total}

    def finish_reason(self) -> str:
        limit = self.generation.max_tokens or mapping.DEFAULT_MAX_TOKENS
        return "length" if self.completion_tokens is not None and self.completion_tokens >= limit else "stop"

    def chunk(self, delta: Any, finish_reason: str | None = None) -> dict[str, Any]:
        """A streamed chunk: chat's `delta` object, or a completion's text."""
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
            kind = "text_completion"
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.generation.model,
            "choices": [choice],
        }

    def whole(self) -> dict[str, Any]:
        text = "".join(self.pieces)
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            kind = "chat.completion"
        else:
            choice, kind = {"index": 0, "text": text}, "text_completion"
        choice.update(logprobs=None, finish_reason=self.finish_reason())
        doc = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.generation.model,
            "choices": [choice],
        }
        usage = self.usage()
        if usage is not None:
            doc["usage"] = usage
        return doc


def _embedding_doc(text: str) -> Callable[[ModelConfig], dict]:
    return lambda config: mapping.embedding_doc(config, text)


def _generation_doc(config: ModelConfig, generation: Generation, chat: bool) -> dict:
    prompt = chat_prompt(config, generation.messages) if chat else generation.prompt
    return mapping.generation_doc(config, generation, prompt)


def _model_doc(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": STARTED_S, "owned_by": OWNED_BY}


def _encoded(vector: np.ndarray, encoding: str) -> Any:
    if encoding == "base64":  # OpenAI's: the float32 vector's little-endian bytes
        return base64.b64encode(vector.astype("<f4").tobytes()).decode()
    return vector.tolist()
