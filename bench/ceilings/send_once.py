"""Serve an ASGI app the way ringserve's gateway serves its own: uvicorn with GatewayHttpProtocol.

`python -m bench.ceilings.send_once bench.ceilings.raw_asgi:app --port N` runs the raw ASGI
ceiling with the gateway's HTTP settings (one send() per response, no proxy headers, no
server header), so the bench can show what that HTTP layer is worth on its own: the
`raw_asgi_send_once` case. The ceiling ringserve is held to stays plain uvicorn (`raw_asgi`).
"""
from __future__ import annotations

import argparse

import uvicorn

from ringserve.gateway.http.engine import UVICORN_OPTIONS
from ringserve.gateway.http.fast import GatewayHttpProtocol


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ceilings.send_once")
    p.add_argument("app", help="module:attribute of the ASGI app")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    uvicorn.Server(uvicorn.Config(args.app, host=args.host, port=args.port, **UVICORN_OPTIONS, http=GatewayHttpProtocol)).run()


if __name__ == "__main__":
    main()
