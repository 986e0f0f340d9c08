"""Run inside a private mount namespace whose /dev/shm is small (tests/integration/test_environment.py):
`python tests/support/small_shm_serve.py REPO ARGS...` starts the real stack on REPO with ARGS, waits
until it is ready, infers, kills gateway 0 and waits for its successor to serve, stops it with SIGTERM,
and prints one JSON line of what it saw. Exit 0 only when all of that happened and nothing was left."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run as a file: the repo root for `tests`)

from ringserve.shm.layout import SEGMENT_HEADER  # noqa: E402
from tests.support.stack import Stack, poll_for, shm_segments  # noqa: E402

MLP_REQUEST = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}


def ring_size(name: str) -> list[int]:
    """A ring's slot count and slot bytes, from its header (shm/layout.py)."""
    with open(f"/dev/shm/{name}", "rb") as segment:
        _, _, slot_count, slot_bytes, _ = SEGMENT_HEADER.unpack(segment.read(SEGMENT_HEADER.size))
    return [slot_count, slot_bytes]


def gateway_pids(stack: Stack) -> dict[int, int]:
    return {g["index"]: g["pid"] for g in stack.status()["gateways"] if g["pid"]}


def main(repo: str, *args: str) -> int:
    stack = Stack(Path(repo), *args)
    seen: dict = {}
    try:
        stack.start(ready_timeout_s=120)
        seen["rings"] = [ring_size(name) for name in shm_segments(stack.pid)]  # [slot_count, slot_bytes] each
        seen["infer"] = stack.post("/v2/models/mlp/infer", MLP_REQUEST)[0]
        first = poll_for(lambda: gateway_pids(stack).get(0), 10, what="the supervisor's snapshot naming gateway 0")
        os.kill(first, signal.SIGKILL)
        # Its ring is unlinked, but the workers map it until the successor attaches: the new ring needs room.
        poll_for(lambda: gateway_pids(stack).get(0) not in (None, first), 60, 0.1, "a new gateway 0")
        poll_for(stack.is_ready, 60, 0.05, "the restarted gateway to be ready")
        seen["infer_after_gateway_restart"] = stack.post("/v2/models/mlp/infer", MLP_REQUEST)[0]
        seen["stop_exit"] = stack.stop()
    finally:
        stack.kill_everything()
    stack.assert_nothing_left()
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
