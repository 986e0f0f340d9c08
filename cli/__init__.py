"""`ringserve`: serve, serve with tritonserver's flags (tritonserver.py), build demo models, show a running
server's status.

    parser    the parser: subcommands and every serve flag (type and default from Settings); serve, demo-models
    flags     the serve flags' values: sizes, device lists, booleans; the Settings built from the flags given
    status    `ringserve status`: /admin/status as tables
    __main__  `python -m ringserve.cli`
"""

from __future__ import annotations

import os
import sys

from ringserve.cli.flags import ENV_API_KEY, parse_bool, parse_bytes, parse_gpus, settings_from_args
from ringserve.cli.parser import build_parser, serve_settings
from ringserve.common.exits import EXIT_OK

__all__ = [
    "ENV_API_KEY",
    "build_parser",
    "main",
    "parse_bool",
    "parse_bytes",
    "parse_gpus",
    "serve_settings",
    "settings_from_args",
]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["tritonserver"]:
        from ringserve import tritonserver  # noqa: PLC0415 - its parser only for its command

        return tritonserver.main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        # `ringserve status | head -1`: the reader left. Point stdout at /dev/null so that the
        # interpreter's final flush does not raise again (the recipe of Python's signal docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
