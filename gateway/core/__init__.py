"""What every layer of the gateway shares.

request      one accepted inference request (InferRequest) and the bytes it takes in a slot
errors       the gateway's errors and the one table that maps them to HTTP statuses
phrases      Triton's words for the conditions ringserve reports
regions      client shared-memory regions, read with preadv and written with pwritev
region_registry  the regions one gateway holds: register, unregister, status
region_errors    why a region is refused, in Triton's words
descriptors  one open-files budget for HTTP, gRPC and regions
settings     the dispatch settings
scheduling   gRPC's helper threads under SCHED_BATCH: they do not preempt the event loop's thread
"""
