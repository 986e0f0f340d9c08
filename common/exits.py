"""Exit codes of ringserve's processes, and the reasons a worker stops or restarts.

The reasons are what the status endpoint, STATUS= and the logs show: restart counters by
reason, a worker's last exit. A reason that is not one of these names a signal or an exit
status (`SIGKILL`, `exit_3`: supervision/children.py: exit_reason).
"""

from __future__ import annotations

from typing import Final

from ringserve.common.vocabulary import KillReason

EXIT_OK = 0
EXIT_FAILURE = 1  # `ringserve status`: the server did not answer
EXIT_USAGE = 2  # bad flags or settings (argparse exits with 2 too)
# A child that cannot boot (ring not attachable, repository unreadable, port in use): restarting
# won't help. The supervisor stops with the same code when its gateway exits with it.
EXIT_BOOT_ERROR = 3
EXIT_GATEWAY_CRASH_LOOP = 4  # the gateway kept dying soon after its start: restarting won't help
EXIT_NO_SHARED_MEMORY = 5  # /dev/shm cannot hold the ring
EXIT_BAD_RUNTIME_DIR = 6  # --runtime-dir is someone else's, open to others, or cannot be made
EXIT_MODEL_ERROR = 7  # --exit-on-error: a model of the repository cannot be served

# Deaths the supervisor caused, reported as why it did it.
REASON_HUNG: Final = "hung"  # no heartbeat for --hang-timeout-s
REASON_BATCH_TIMEOUT: Final = "batch_timeout"  # a batch ran past --batch-timeout-s (the gateway asked)
# A call into model code ran past its bound (--load-timeout-s, ..., or the model's parameter):
# "<hook>_timeout", judged from the heartbeat's record of its calls (worker/progress.py).
REASON_LOAD_TIMEOUT: Final = "load_timeout"
REASON_WARMUP_TIMEOUT: Final = "warmup_timeout"
REASON_EXECUTE_TIMEOUT: Final = "execute_timeout"
REASON_FINALIZE_TIMEOUT: Final = "finalize_timeout"
CALL_TIMEOUT_REASONS: dict[str, KillReason] = {
    "load": REASON_LOAD_TIMEOUT,
    "warmup": REASON_WARMUP_TIMEOUT,
    "execute": REASON_EXECUTE_TIMEOUT,
    "finalize": REASON_FINALIZE_TIMEOUT,
}
REASON_OOM = "oom"  # SIGKILLed while the cgroup's OOM-kill count rose
# Stops the supervisor asked for (SIGTERM): not counted as restarts.
REASON_STOPPING: Final = "stopping"  # the server stops
REASON_RETIRED: Final = "retired"  # its successor serves
# Zero-downtime replacements (restart counters).
REASON_RELOAD: Final = "reload"  # SIGHUP, or a quarantined model loaded again
REASON_RECYCLED: Final = "recycled"  # --max-batches-per-worker
REASON_MEMORY: Final = "memory"  # --worker-memory-limit
# The gateway requeues the batches of a replaced worker with this reason (gateway/dispatch/dispatcher.py).
REASON_REPLACED = "replaced"

# reported as the exit reason
KILL_REASONS: tuple[str, ...] = (REASON_HUNG, REASON_BATCH_TIMEOUT, *CALL_TIMEOUT_REASONS.values())
