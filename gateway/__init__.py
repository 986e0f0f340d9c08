"""The gateway: KServe v2 over HTTP and gRPC, batching, and the gateway's side of the workers.

One gateway process (`python -m ringserve.gateway`, started by the supervisor) serves both protocols on
one event loop. Its folders, top to bottom; each imports only the folders below it (import-linter's
contract in pyproject.toml, checked by tests/unit/test_layering.py), and each __init__ is its map:

    __main__   argv, settings and sockets; runs the process on its loop
    process    the composition root: builds the parts, runs HTTP and gRPC as peers, start and drain order
    descriptors  one open-files budget for HTTP, gRPC and regions, fitted to RLIMIT_NOFILE by __main__
    http/      the HTTP front end: ASGI app, routes, its engine (the fast path or uvicorn's own)
    grpc/      the gRPC front end: Triton's GRPCInferenceService, its codec, stream windows
    openai/    OpenAI's routes under /v1 (mounted by http/): completions, chat, embeddings over the data plane
    calls/     the workers' front end: a lane's BLS call or ensemble step to a model in another lane
    kserve/    the data plane both front ends call (one call context each), the protocol-free operations
    cluster/   the gateways together: peers, merged numbers, Triton's nv_* metrics
    cache/     Triton's response cache: a hit answered before the batcher, the store every gateway shares
    dispatch/  the gateway's side of the workers: dispatcher, scheduler, recovery, fleet, catalog, link
    observe/   what is counted and logged: metrics, Triton's statistics, process metrics, access log
    codec/     the KServe codec: a request document in, the response document out (a leaf)
    batching/  a model's queue and how batches form: lanes, deadlines, slots, padding, ragged, sizing
    core/      what every layer shares: the request, errors and Triton's phrases, regions, dispatch settings

docs/architecture.md draws the life of a batch through them.
"""
