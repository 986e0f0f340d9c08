"""The gRPC front end (Triton's `inference.GRPCInferenceService`): protobuf in, the data plane's outcome
out. It imports no HTTP module.

    server   the service's RPCs, the health service, the listener
    codec    ModelInferRequest <-> the KServe document the data plane parses; responses in protobuf
    stream   the window of one ModelStreamInfer: requests read and not yet answered back
"""
