"""The load `python -m bench recovery` kills workers under: closed-loop clients on an event loop in a
thread of its own, every answer counted by status and every 200 checked against ONNX Runtime's result
computed here.

A client sends its next request a pause after its answer, a 503's included (no Retry-After
wait): uniform in [0, 2 x think_s), so that the clients do not fall into step (in step, a death
finds either all of them waiting in the queue or all of them between requests). Requests already queued when a worker dies wait for its replacement; the 503s are the
requests that arrived while no worker was ready, so their share grows with the outage. `lost` counts requests
that got no HTTP answer at all (a connection error or the client's timeout), `wrong` 200s whose
numbers differ from ONNX Runtime's.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import orjson

RETRY_PAUSE_S = 0.01  # after a connection error, so that a refused connection is no busy loop


@dataclass
class Tally:
    """What the clients got: answers by status, 200s with the wrong numbers, requests with no answer."""

    statuses: Counter = field(default_factory=Counter)
    wrong: int = 0
    lost: int = 0
    samples: list[str] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return sum(self.statuses.values())

    def to_json(self) -> dict[str, Any]:
        answers = self.answers
        return {"answers": answers, "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "share_503": self.statuses.get(503, 0) / answers if answers else None, "wrong": self.wrong,
                "lost": self.lost, "samples": self.samples[:5]}


class CheckedLoad:
    """`clients` closed-loop clients against `url` until `stop`, cycling through the bodies."""

    def __init__(self, url: str, bodies: list[bytes], expected: list[np.ndarray], clients: int,
                 timeout_s: float, think_s: float = 0.0) -> None:
        self.url, self.bodies, self.expected = url, bodies, expected
        self.clients, self.timeout_s, self.think_s = clients, timeout_s, think_s
        self.tally = Tally()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="recovery-load", daemon=True)

    def __enter__(self) -> CheckedLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> Tally:
        self._stopping.set()
        self._thread.join()
        return self.tally

    def wait_for_answers(self, count: int, timeout_s: float = 60.0) -> None:
        """Until the clients have `count` answers (so that the load is on before a measurement)."""
        deadline = time.monotonic() + timeout_s
        while self.tally.answers < count and time.monotonic() < deadline:
            time.sleep(0.01)

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.clients)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self._client(session, c) for c in range(self.clients)))

    async def _client(self, session: aiohttp.ClientSession, client: int) -> None:
        i, pauses = client, random.Random(client)
        while not self._stopping.is_set():
            i = (i + 1) % len(self.bodies)
            try:
                async with session.post(self.url, data=self.bodies[i],
                                        headers={"content-type": "application/json"}) as response:
                    status, body = response.status, await response.read()
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                self.tally.lost += 1
                self._sample(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            self.tally.statuses[status] += 1
            if status == 200 and not self._right(body, i):
                self.tally.wrong += 1
                self._sample(f"wrong numbers: {body[:200]!r}")
            elif status != 200:
                self._sample(f"{status}: {body[:200]!r}")
            if self.think_s:
                await asyncio.sleep(pauses.uniform(0.0, 2 * self.think_s))

    def _right(self, body: bytes, i: int) -> bool:
        try:
            out = orjson.loads(body)["outputs"][0]
            got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        except (ValueError, KeyError, IndexError, TypeError):
            return False
        return got.shape == self.expected[i].shape and bool(np.allclose(got, self.expected[i], atol=1e-4))

    def _sample(self, text: str) -> None:
        if len(self.tally.samples) < 20:
            self.tally.samples.append(text)
