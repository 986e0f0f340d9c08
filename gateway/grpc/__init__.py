"""The gRPC front end (Triton's `inference.GRPCInferenceService`): protobuf in, the data plane's outcome
out. It imports no HTTP module.

    server      the service's RPCs (InferenceService), on the data plane
    listener    the listener: `grpc_listener` (the gateway's one entry), the engine chosen, its options,
                the health service
    context     what the servicer asks of an engine: a call's context, a request stream (Protocols)
    core        the fast path: grpcio's core server drained into the gateway's loop (a poller thread), with
                its version window and surface check; with core_call, the only modules that import grpc._cython
    core_call   the fast path's call: its context, its request stream read ahead, its response stream's sends
    aio         the public path: grpcio's grpc.aio server, running the same servicer
    connections what one connection may hold: calls in flight and their requests' bytes
    codec       ModelInferRequest <-> the KServe document the data plane parses; responses in protobuf
    scheduling  gRPC's helper threads (grpcio's and the poller) under SCHED_BATCH: they do not preempt the
                event loop's thread
    stream      one ModelStreamInfer served: its window (requests read, not yet answered back), its answers
                in order, each request served as it arrives
    settings    LogSettings and TraceSetting (Triton's logging and trace extensions, over cluster/runtime_settings)
"""
