"""The inference worker: one process (spawned by the supervisor, or a warm spare) that runs batches
from every gateway's ring on views of that memory and writes the outputs back into it.

    __main__     `python -m worker`: settings, sockets, threads, eager loads, the loop
    loop         the batch loop: Batch in over ZeroMQ from every gateway (round-robin), Result out
    threads      the heartbeat thread and the model loader thread, each with its own sockets
    progress     the calls into model code running now, each with its bound (carried by the heartbeats)
    spare        a warm spare: set up but for its models, waiting to take a dead worker's place
    slots        a batch's tensors in its slot: inputs read as views, outputs written back
    fusion       batches of one model version from several gateways run as one execution
    models       the model lifecycle: every (model, version) it may serve, loaded when needed
    runner       the Runner: what the loop, BLS and warm-up ask of a loaded version, whatever its kind
    onnx_model   ONNX models as Runners: a batch on its slot, BLS requests joined, warm-up samples
    session      ONNX Runtime sessions: provider choice (CUDA when it really loads), options, reshape
    warmup       a loaded version's warm-up samples (Triton's model_warmup), run before it is ready
    arena        memory handed back after an outsized run (ONNX Runtime's CPU arena keeps it)
    footprint    how much memory a loaded model takes, measured around its load
    python/      the Python backend: model.py run here only, `triton_python_backend_utils` (pb_utils),
                 decoupled streams and cancellation, BLS to a decoupled model (its __init__ maps it)
    requests     a batch's requests one by one, for models that answer each on its own
    bls          a model of the repository run from inside the worker: BLS requests, ensemble steps
    ensemble     Triton's `platform: "ensemble"`: its steps run in one worker
    errors       errors raised inside the worker process
    faults       native failures on demand, for chaos tests only
"""
