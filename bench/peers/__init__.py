"""The peers a user would pick instead of ringserve, serving the same ONNX model with their own batching.

Each is installed by the bench, when asked (`--peers`), into its own virtual environment under
bench/.peers/<name>/venv, never into ringserve's; an install is reused while its requirements
are unchanged. A peer that cannot be installed or started is skipped with one line that says
why. Every peer runs ONNX Runtime 1.31.1 on the CPU with one intra-op thread and spinning off,
as ringserve's worker does, batches up to 64 requests, and waits at most
PEER_BATCH_WAIT_S for a batch to fill (each framework's own knob, named below).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.servers import Probe, Service, free_port

log = logging.getLogger(__name__)

PEERS_DIR = Path(__file__).resolve().parent.parent / ".peers"  # git-ignored
APPS_DIR = Path(__file__).resolve().parent
ORT_PIN = "onnxruntime==1.31.1"
# MLServer 1.7.1's parallel worker calls asyncio.get_event_loop() before setting a loop, which
# uvloop >= 0.22 refuses ("There is no current event loop"); MLServer itself leaves uvloop unpinned.
MLSERVER_UVLOOP_PIN = "uvloop<0.22"
PEER_MAX_BATCH = 64
PEER_BATCH_WAIT_S = 0.002
INSTALL_TIMEOUT_S = 1200


class PeerUnavailable(RuntimeError):
    def __init__(self, peer: str, why: str) -> None:
        super().__init__(f"{peer}: skipped, {why}")
        self.peer = peer
        self.why = why


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    requirements: tuple[str, ...]
    batching: str  # the knob and value, for the report
    interpreter: str | None = None  # "3.13": the venv must be made with that Python (None: this one)

    @property
    def venv(self) -> Path:
        return PEERS_DIR / self.name / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


PEERS = {
    "mlserver": Peer("mlserver", "MLServer (adaptive batching)", ("mlserver", ORT_PIN, MLSERVER_UVLOOP_PIN),
                     f"model-settings max_batch_size {PEER_MAX_BATCH}, max_batch_time {PEER_BATCH_WAIT_S} s; "
                     "parallel_workers 1"),
    "rayserve": Peer("rayserve", "Ray Serve (@serve.batch)", ("ray[serve]", ORT_PIN),
                     f"@serve.batch(max_batch_size={PEER_MAX_BATCH}, batch_wait_timeout_s={PEER_BATCH_WAIT_S}); "
                     "1 replica"),
    "litserve": Peer("litserve", "LitServe (batching)", ("litserve", ORT_PIN),
                     f"LitAPI(max_batch_size={PEER_MAX_BATCH}, batch_timeout={PEER_BATCH_WAIT_S}); "
                     "1 worker, fast_queue"),
    # The tritonserver bundled in nvidia-pytriton embeds libpython3.13 in its Python backend stub, so the
    # venv is made with Python 3.13 (a 3.11 venv fails inside the stub). Its numpy<2 pin is real: with
    # numpy 2 the stub (built against numpy 1's ABI) misreads every output ("output tensor shape does not
    # match size of output"). numpy 1.26 has no wheel for 3.13: pip compiles it once (~6 CPU-minutes;
    # its wheel cache keeps the result for later installs).
    "triton": Peer("triton", "Triton (PyTriton's tritonserver, dynamic batching)",
                   (ORT_PIN, "numpy<2", "nvidia-pytriton==0.7.0"),
                   f"ModelConfig(max_batch_size={PEER_MAX_BATCH}, DynamicBatcher(max_queue_delay_microseconds="
                   f"{int(PEER_BATCH_WAIT_S * 1e6)})): tritonserver 2.51's C++ HTTP front end and dynamic batcher, "
                   "its Python backend handing each batch to ONNX Runtime in the PyTriton process",
                   interpreter="3.13"),
}


def find_interpreter(version: str) -> str | None:
    """A working python<version>: on PATH (a pyenv shim for a version not selected fails: tried, skipped),
    else one of pyenv's (~/.pyenv/versions/<version>.*/bin)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}"),
                  *map(str, sorted(root.glob(f"{version}.*/bin/python{version}"), reverse=True))]
    for candidate in filter(None, candidates):
        try:
            if subprocess.run([candidate, "-c", "pass"], capture_output=True, timeout=30, check=False).returncode == 0:
                return candidate
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def install(peer: Peer, log_path: Path | None = None) -> Path:
    """The peer's venv python, creating the venv and pip-installing when needed."""
    marker = PEERS_DIR / peer.name / "installed.json"
    base = sys.executable
    if peer.interpreter is not None:
        base = find_interpreter(peer.interpreter)
        if base is None:
            raise PeerUnavailable(peer.name, f"it needs Python {peer.interpreter} (python{peer.interpreter} on PATH or "
                                             f"under ~/.pyenv/versions), and there is none")
    version = subprocess.run([base, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=False).stdout.strip()
    wanted = {"requirements": list(peer.requirements), "python": version}
    if marker.exists() and peer.python.exists():
        try:
            if json.loads(marker.read_text()) == wanted:
                return peer.python
        except ValueError:
            pass
    log_path = log_path or PEERS_DIR / peer.name / "install.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("installing %s into %s (%s); log: %s", peer.name, peer.venv, " ".join(peer.requirements), log_path)
    pip = [str(peer.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    steps = [[base, "-m", "venv", "--clear", str(peer.venv)], [*pip, *peer.requirements]]
    with open(log_path, "ab") as out:
        for step in steps:
            try:
                done = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S,
                                      check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise PeerUnavailable(peer.name, f"install failed ({exc}); see {log_path}") from None
            if done.returncode != 0:
                raise PeerUnavailable(peer.name, f"`{' '.join(step[:4])} ...` exited {done.returncode}; "
                                                 f"see {log_path}")
    marker.write_text(json.dumps(wanted) + "\n")
    return peer.python


def peer_service(peer: Peer, model_path: Path, *, workdir: Path, log_dir: Path, body: bytes) -> Service:
    """A Service for an installed peer serving `model_path` at /v2/models/mlp/infer."""
    port = free_port()
    infer_path = "/v2/models/mlp/infer"
    probe = Probe(post_path=infer_path, post_body=body)
    bin_dir = peer.venv / "bin"
    env = {"PYTHONPATH": str(APPS_DIR), "OMP_NUM_THREADS": "1"}
    if peer.name == "mlserver":
        home = workdir / "mlserver"
        (home / "mlp").mkdir(parents=True, exist_ok=True)
        shutil.copy2(model_path, home / "mlp" / "model.onnx")
        (home / "settings.json").write_text(json.dumps({
            "debug": False, "host": "127.0.0.1", "http_port": port, "grpc_port": free_port(),
            "metrics_port": free_port(), "parallel_workers": 1}))
        (home / "mlp" / "model-settings.json").write_text(json.dumps({
            "name": "mlp", "implementation": "mlserver_runtime.OnnxModel", "max_batch_size": PEER_MAX_BATCH,
            "max_batch_time": PEER_BATCH_WAIT_S, "parameters": {"uri": "./model.onnx"}}))
        command = [str(bin_dir / "mlserver"), "start", str(home)]
    elif peer.name == "litserve":
        command = [str(peer.python), str(APPS_DIR / "litserve_app.py"), str(model_path), str(port),
                   str(PEER_MAX_BATCH), str(PEER_BATCH_WAIT_S)]
    elif peer.name == "triton":
        grpc_port = free_port()  # (bench protocols sends gRPC to it: Service.grpc_port)
        command = [str(peer.python), str(APPS_DIR / "triton_app.py"), str(model_path), str(port), str(grpc_port),
                   str(free_port()), str(PEER_MAX_BATCH), str(PEER_BATCH_WAIT_S)]
    elif peer.name == "rayserve":
        # Ray's unix sockets live under its temp dir; keep the path short (108-byte limit).
        env.update(RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tempfile.mkdtemp(prefix="rb-ray-", dir="/tmp"))
        command = [str(peer.python), str(APPS_DIR / "rayserve_app.py"), str(model_path), str(port),
                   str(PEER_MAX_BATCH), str(PEER_BATCH_WAIT_S)]
    else:
        raise PeerUnavailable(peer.name, "unknown peer")
    # Ctrl-C is how LitServe and Ray Serve are meant to be stopped: on SIGTERM LitServe leaves its
    # workers running and Ray aborts from its own handler.
    stop_signal = signal.SIGTERM if peer.name in ("mlserver", "triton") else signal.SIGINT
    service = Service(peer.name, "peer", command, port=port, log_dir=log_dir, probe=probe, infer_path=infer_path,
                      env=env, cwd=workdir, description=f"{peer.label}: {peer.batching}", stop_signal=stop_signal)
    if peer.name == "triton":
        service.grpc_port = grpc_port
    return service


def cleanup_peer_temp(service: Service) -> None:
    """Remove the temp dir a peer was given (Ray's sessions and logs)."""
    tmp = (service.env or {}).get("RAY_TMPDIR")
    if tmp and Path(tmp).name.startswith("rb-ray-"):
        shutil.rmtree(tmp, ignore_errors=True)
