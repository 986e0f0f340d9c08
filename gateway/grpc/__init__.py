"""The gRPC front end (Triton's `inference.GRPCInferenceService`): protobuf in, the data plane's outcome
out. It imports no HTTP module.

    server   the service's RPCs (InferenceService), on the data plane
    listener the listener: the service's handlers on the core server, its options, the health service
    core     grpcio's core server drained into the gateway's loop (a poller thread), and a call's context
    codec    ModelInferRequest <-> the KServe document the data plane parses; responses in protobuf
    stream   the window of one ModelStreamInfer: requests read and not yet answered back
"""
