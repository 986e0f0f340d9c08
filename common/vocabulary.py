"""The few strings that message and record fields take, each family as one `Literal`, shared from here.

mypy checks a field annotated with one of these against what is written to it; the frozensets
beside them are for the code that checks a value at run time (a config file, a peer's answer).
Free text (an exit reason that names a signal, a runtime's error) stays `str`.
"""

from __future__ import annotations

from typing import Literal, get_args

# -- model versions in a worker (worker/models.py; ModelStateReport, ModelState, Load) -----------
ModelVersionState = Literal["unloaded", "loading", "ready", "unloading", "failed"]
# Why a version was loaded or unloaded; the gateway counts unloads by UNLOAD_CAUSES.
LoadCause = Literal["eager", "lazy", "api", "ttl", "lru", "budget"]
UNLOAD_CAUSES: tuple[LoadCause, ...] = ("ttl", "lru", "api")
# A ModelState's cause: a load cause, or "peak" (it changes no state: more batches hold the version
# than ever before); "" only as the field's default.
ChangeCause = Literal[LoadCause, "peak", ""]
CAUSE_PEAK: ChangeCause = "peak"
LoadPolicy = Literal["eager", "lazy"]  # a model's `model_load_policy` (common/repository/lifecycle.py)
LOAD_POLICIES: tuple[LoadPolicy, ...] = get_args(LoadPolicy)

# Why a batch never ran: the gateway answers these 503 without blaming (bisecting) a request.
ErrorKind = Literal["budget", "load_failed", "not_served"]
ERROR_KINDS_NOT_RUN: frozenset[str] = frozenset(get_args(ErrorKind))

# -- worker processes (the names are common/exits.py's REASON_*) ---------------------------------
WorkerState = Literal["starting", "ready", "retiring", "retired", "dead"]  # the gateway's view of a worker
# deaths the supervisor caused (KillWorker's reason; a call past its bound: common/exits.py)
KillReason = Literal["hung", "batch_timeout", "load_timeout", "warmup_timeout", "execute_timeout", "finalize_timeout"]
StopReason = Literal["stopping", "retired"]  # stops the supervisor asked for: not counted as restarts
ReplaceReason = Literal["reload", "recycled", "memory"]  # zero-downtime replacements (WorkerStarted's reason)
SpareState = Literal["none", "starting", "ready"]  # a device's warm spare: none now, importing, primed

# -- the server -----------------------------------------------------------------------------------
ServiceState = Literal["starting", "ready", "reloading", "stopping"]  # the supervisor's, for systemd
ProcessRole = Literal["supervisor", "gateway", "worker"]  # the `role` label of the process_* families
ChildRole = Literal["gateway", "worker", "spare"]  # the supervisor's children
RepositoryAction = Literal["load", "unload"]  # a repository change one gateway carried out
