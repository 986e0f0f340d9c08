"""The HTTP ceilings: the fastest Python endpoints that do the same unavoidable work as ringserve.

Both read the KServe v2 JSON body, parse it and turn the input's data into a float32 numpy
array (what any server must do before it can run a model), then answer with a precomputed
body the size of ringserve's `mlp` answer. No model, no queue, no batching: what is left is
HTTP + JSON in one Python process, the most ringserve's single gateway process could reach.

- raw_asgi: a bare ASGI callable, orjson (ringserve's gateway takes the same raw path).
- starlette_json: a plain Starlette route with the stdlib json module (the bare Starlette +
  uvicorn endpoint a user would write first).

Both run under uvicorn with the gateway's settings: uvloop, httptools, no access log.
"""
from __future__ import annotations

import numpy as np
import orjson

ANSWER_SEED = 20240601
OUTPUT_WIDTH = 10


def precomputed_answer(model: str = "mlp") -> bytes:
    """The shape and size of ringserve's answer: 10 float32 values serialized by orjson."""
    rng = np.random.default_rng(ANSWER_SEED)
    data = rng.standard_normal(OUTPUT_WIDTH).astype(np.float32)
    return orjson.dumps({"model_name": model, "model_version": "1",
                         "outputs": [{"name": "y", "datatype": "FP32", "shape": [1, OUTPUT_WIDTH], "data": data}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)
