"""gateway/cluster/runtime_settings.py's desk: a change answers once the supervisor confirmed it and every
other gateway that answers has applied it."""
from __future__ import annotations

import asyncio
import json
import logging

from ringserve.common import runtime_settings
from ringserve.common.runtime_settings import ChangeRuntimeSettings, State
from ringserve.gateway.cluster.peers import PeerAnswer
from ringserve.gateway.cluster.runtime_settings import SettingsDesk


class Supervisor:
    """The dispatcher's side the desk uses: the supervisor answers each change at once with its next state."""

    def __init__(self) -> None:
        self.settings = type("Settings", (), {"gateway": 0})()
        self.on_runtime_settings: list = []

    def tell_supervisor(self, change: ChangeRuntimeSettings) -> bool:
        state = runtime_settings.current.merged(change)
        runtime_settings.adopt(state.message())
        asyncio.get_running_loop().call_soon(lambda: [heard(state.message(change.token))
                                                      for heard in self.on_runtime_settings])
        return True


class LatePeers:
    """Gateway 1 has the new revision only at its third answer; gateway 2 is restarting (no answer)."""

    def __init__(self) -> None:
        self.asked = 0

    async def get(self, path: str) -> list[PeerAnswer]:
        self.asked += 1
        revision = runtime_settings.current.revision - (1 if self.asked < 3 else 0)
        return [PeerAnswer(1, 200, json.dumps({"revision": revision}).encode()), PeerAnswer(2, error="restarting")]


def test_a_change_answers_once_the_other_gateways_have_applied_it() -> None:
    root = logging.getLogger()
    handlers, level, saved = root.handlers[:], root.level, runtime_settings.current
    root.handlers = [logging.NullHandler()]  # (adopting sets the root handlers' formatter: not pytest's)
    peers = LatePeers()
    try:
        desk = SettingsDesk(Supervisor(), peers)  # type: ignore[arg-type]
        asyncio.run(desk.change(log={"log_verbose_level": 1}))
        assert runtime_settings.current.log.log_verbose_level == 1 and peers.asked == 3
        assert desk.waiting == {}
    finally:
        root.handlers, runtime_settings.current = handlers, saved
        root.setLevel(level)
