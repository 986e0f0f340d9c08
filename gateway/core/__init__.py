"""What every layer of the gateway shares: only modules that several folders use live here (a module with
one user went to it: the open-files budget to the gateway's root beside __main__, gRPC's thread scheduling
to grpc/). The regions are parsed by the codec, written by batching/ and dispatch/, served by kserve/; the
dispatch settings are dispatch/'s, read by kserve/ and the process too.

request      one accepted inference request (InferRequest) and the bytes it takes in a slot
errors       the gateway's errors and the one table that maps them to HTTP statuses
phrases      Triton's words for the conditions ringserve reports
regions      client shared-memory regions, read with preadv and written with pwritev
region_registry  the regions one gateway holds: register, unregister, status
region_errors    why a region is refused, in Triton's words
settings     the dispatch settings
"""
