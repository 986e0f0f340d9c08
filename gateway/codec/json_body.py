"""The JSON of a request body: read with a budget counted before it is parsed (JsonBudget), and
Triton's NaN/Infinity literals where a body has them."""

from __future__ import annotations

import json
from typing import Any

import orjson

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.errors import BadRequest, TooManyValues
from ringserve.gateway.core.phrases import say

# What a request document holds besides tensor values: its objects' members, shapes, names, ids and
# parameters. Generous: a JSON text past the values a slot can hold by more than this is refused unparsed.
JSON_STRUCTURE_COMMAS = 4096
WIDEST_ITEM_BYTES = 8


class JsonBudget:
    """The commas of a request's JSON text, counted before orjson makes an object of every value.

    Every value of a tensor's data but the last is followed by a comma (nested rows too: E values
    in non-empty lists have E - 1), and each takes at least `least` bytes in a slot (its itemsize;
    for a BYTES input 1, as a comma inside a string takes its byte there), so a text with more than
    capacity / least + JSON_STRUCTURE_COMMAS commas cannot fit whatever it holds. Counting runs at
    memory speed (1.3 GB/s here, where orjson and numpy take 25 ns a byte and more): a 64 MiB JSON of
    zeros (64 KiB of gzip) held the loop 2.5 s before its 400. A compressed body is counted as it
    inflates (gateway/http/routes.py), so such a bomb stops a few MiB in.
    """

    def __init__(self, config: ModelConfig, capacity_bytes: int, json_bytes: int | None = None) -> None:
        least = min((1 if t.datatype == "BYTES" else t.np_dtype.itemsize for t in config.inputs), default=1)
        self.limit = capacity_bytes // least + JSON_STRUCTURE_COMMAS
        self.capacity_bytes = capacity_bytes
        self.left = json_bytes  # how much of what is still to come is JSON (None: all of it)
        self.commas = 0

    def count(self, chunk: bytes | memoryview) -> None:
        if self.left is not None:
            if self.left <= 0:
                return
            chunk = chunk[: self.left]
            self.left -= len(chunk)
        self.commas += (chunk if type(chunk) is bytes else bytes(chunk)).count(b",")
        if self.commas > self.limit:
            raise TooManyValues("the request's JSON", self.commas, self.limit, self.capacity_bytes)


def load_json(body: bytes | memoryview) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        text = bytes(body)  # a memoryview's `in` looks for one byte value, not a substring
        if b"NaN" in text or b"Infinity" in text:
            doc = load_json_with_non_finite(text)
            if doc is not NOT_JSON:
                return doc
        hint, condition = "", "json"
        if "depth" in str(exc):
            hint, condition = "; objects and arrays may nest at most 1024 deep", "json_depth"
        raise BadRequest(
            say(condition, f"request body is not valid JSON (UTF-8): {exc}{hint}", error=exc, limit=1024)
        ) from None


NOT_JSON = object()


def load_json_with_non_finite(text: bytes) -> Any:
    """A body orjson refused that holds NaN, Infinity or -Infinity: literals RFC 8259 lacks, which Triton's
    rapidjson reads (kParseNanAndInfFlag) and its writers put for non-finite floats (rapidjson's
    kWriteNanAndInfFlag, the Python client's python-rapidjson, perf_analyzer).

    orjson has no option for them; falling back only after orjson failed keeps every other request on
    its fast parse. orjson first checks a copy with the literals replaced by 0 (inside strings too,
    where that leaves a string a string), so that the body holds to orjson's rules otherwise (UTF-8,
    no lone surrogates, 64-bit integers, 1024 levels; NOT_JSON when it does not, and the caller
    reports orjson's first error); then the standard library's json, which reads the literals as
    float('nan'), float('inf'), float('-inf') and refuses any other spelling, gives the values.
    Measured for 512 FP32 values: 15 to 20x orjson's parse alone (json's float() per value); only
    requests that hold such a literal pay it.
    """
    try:
        orjson.loads(text.replace(b"NaN", b"0").replace(b"Infinity", b"0"))
    except orjson.JSONDecodeError:
        return NOT_JSON
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # what orjson passed and json does not: -NaN, say
        raise BadRequest(
            f"request body is not valid JSON (UTF-8): {exc}; of the non-finite numbers it takes "
            "NaN, Infinity and -Infinity"
        ) from None
