"""Triton's --cache-config: `<cache>,<key>=<value>`, as tritonserver takes it (server docs, response_cache.md).

ringserve serves Triton's `local` cache, whose one key is `size` (bytes): `--cache-config local,size=1048576`
(also written `--cache-config=local,size=1048576`). Another cache (`redis`, a custom one) or key is refused
by name. --response-cache-byte-size N is Triton's older spelling of `local,size=N`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

LOCAL_CACHE = "local"


def parse_cache_config(text: str, parse_size: Callable[[str], int] = int) -> int:
    """`local,size=N` -> N (bytes); argparse.ArgumentTypeError saying what is served otherwise."""
    cache, _, rest = text.partition(",")
    cache = cache.strip()
    if cache != LOCAL_CACHE:
        raise argparse.ArgumentTypeError(
            f"cache {cache!r} is not served: ringserve's response cache is Triton's 'local' (local,size=BYTES)"
        )
    key, eq, value = rest.partition("=")
    if key.strip() != "size" or not eq:
        raise argparse.ArgumentTypeError(f"{text!r}: the local cache takes one key, size (local,size=BYTES)")
    try:
        return parse_size(value.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: size must be a number of bytes") from None
