"""Poll mode (`--model-control-mode poll`): reload when the repository changes, as Triton's poll does.

Every `--repository-poll-secs` the supervisor takes the repository's fingerprint (each model's files: path,
mtime, size; common/repository/control.py) and, when it differs from the last one, reloads as SIGHUP does:
a new worker generation reads the repository while the old one serves, and the gateways add the new
models, drop the removed ones (404) and swap changed configs. A model whose files are being written may be
caught half-written; its load then fails, and the next poll (the files changed again) retries it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ringserve.common.repository.control import fingerprint

log = logging.getLogger(__name__)


class RepositoryPoll:
    """Says when the repository changed since the last look, at most once per `interval_s`."""

    def __init__(self, repository: str, interval_s: float, now: float) -> None:
        self.repository = Path(repository)
        self.interval_s = interval_s
        self._next_at = now + interval_s
        self._last = fingerprint(self.repository)

    def changed(self, now: float) -> bool:
        if now < self._next_at:
            return False
        self._next_at = now + self.interval_s
        current = fingerprint(self.repository)
        if current == self._last:
            return False
        added = sorted(current.keys() - self._last.keys())
        removed = sorted(self._last.keys() - current.keys())
        modified = sorted(n for n in current.keys() & self._last.keys() if current[n] != self._last[n])
        log.info("poll: the repository changed (added %s, removed %s, modified %s)", added, removed, modified)
        self._last = current
        return True
