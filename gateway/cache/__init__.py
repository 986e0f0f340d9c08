"""Triton's response cache, the gateway's side of it: every gateway of the server shares one store.

entries    the key of a request (model, version, every input's name, shape, datatype and bytes) and the
           bytes a response is stored as
responses  the two calls on a request's way (DataPlane: lookup before the batcher, finished after the
           answer), and Triton's cache_hit / cache_miss statistics
raw        the raw-request index beside Triton's key: an HTTP infer request's bytes -> the answer's bytes,
           looked up by HTTP's infer route before it parses (a hit skips parse, validation and encode)
metrics    Triton's nv_cache_* families in /metrics, and the raw index's two

The store itself is shm/cache.py (one shared-memory segment, made by the supervisor, LRU under a byte
budget, a process-shared lock); docs/architecture.md says why it was built so.
"""
