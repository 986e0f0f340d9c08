"""Lanes: which models each worker process serves, so that one model's batches never wait for another's.

A worker runs one batch at a time. When every worker held every model, a model whose `execute` takes
100 ms held up every other model's batches behind it (a 5.6 ms model answered at 199 ms p50). With
`--lanes model` the supervisor gives each model worker processes of its own, its lanes:

- a model gets `instance_group`'s count of lanes (Triton's count: that many executions at once), else
  `--workers` lanes (1 by default);
- lane 0 is the "rest" lane: it serves the first model (by name) and every model no other lane names,
  so a one-model server is one worker process as before (no extra memory), and a model added later by
  a reload or a repository load is served by lane 0 until the next start gives it lanes of its own;
- every other lane serves the one model it is named for.

A worker's lane reaches it on its command line (`--lane-model`, `--lane-exclude`, `--lane-rank`) or in the
warm spare's TAKE_OVER, and it loads only its lane's models; the gateways learn who holds what from the
workers' READY, as they always have. `--lanes model` is the default; `--lanes shared` is the old layout:
`--workers` processes, each with every model. What a lane is and why a process: docs/architecture.md, "Lanes".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ringserve.common.errors import ConfigError
from ringserve.common.repository.lifecycle import Lifecycle
from ringserve.common.repository.scan import model_names, read_config_doc
from ringserve.common.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lane:
    """What one worker index serves: `models` by name (empty: every model but `excludes`)."""

    models: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    rank: int = 0  # which of its model's lanes this is (instance_group's eager placement counts these)

    def serves(self, model: str) -> bool:
        return model in self.models if self.models else model not in self.excludes

    def args(self) -> list[str]:
        """The worker's command-line arguments for this lane."""
        args = [arg for model in self.models for arg in ("--lane-model", model)]
        args += [arg for model in self.excludes for arg in ("--lane-exclude", model)]
        return [*args, "--lane-rank", str(self.rank)] if args else args


SHARED = Lane()  # every model: --lanes shared, and the standby workers


def plan_lanes(settings: Settings) -> list[Lane]:
    """The lanes of `settings.model_repository`, one per serving worker index (standbys not included)."""
    if settings.lanes == "shared":
        return [SHARED] * settings.workers
    try:
        names = model_names(Path(settings.model_repository))
    except ConfigError as exc:  # (the workers say what is wrong with the repository)
        log.warning("lanes: cannot list the repository's models (%s); every worker serves every model", exc)
        return [SHARED] * settings.workers
    if settings.model_control_mode == "explicit" and "*" not in settings.load_models:
        names = [name for name in names if name in settings.load_models]  # the rest come later, to lane 0
    if not names:
        return [SHARED] * settings.workers
    counts = {name: _instances(settings, name) for name in names}
    first, others = names[0], names[1:]
    lanes = [Lane(excludes=tuple(others))]  # the rest lane: the first model and anything not named
    lanes += [Lane(models=(first,), rank=rank) for rank in range(1, counts[first])]
    for name in others:
        lanes += [Lane(models=(name,), rank=rank) for rank in range(counts[name])]
    return lanes


def _instances(settings: Settings, name: str) -> int:
    """instance_group's count for the model (the sum over its groups), else --workers."""
    model_dir = Path(settings.model_repository) / name
    try:
        doc, _ = read_config_doc(model_dir, name)
        count = Lifecycle.from_config_doc(doc).instance_count
    except ConfigError:
        count = 0  # its workers refuse it with the reason; one lane is enough for that
    return count or settings.workers
