"""HTTP ceiling 2: a plain Starlette route; the stdlib json module parses the body.

Run: uvicorn bench.ceilings.starlette_json:app --loop uvloop --http httptools --no-access-log
"""
from __future__ import annotations

import json

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench.ceilings import precomputed_answer

ANSWER = precomputed_answer()


async def infer(request: Request) -> Response:
    doc = json.loads(await request.body())
    tensor = doc["inputs"][0]
    np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])  # the work any server must do
    return Response(ANSWER, media_type="application/json")


async def ready(request: Request) -> Response:
    return Response(b'{"ready":true}', media_type="application/json")


app = Starlette(routes=[Route("/v2/models/{model}/infer", infer, methods=["POST"]),
                        Route("/v2/health/ready", ready)])
