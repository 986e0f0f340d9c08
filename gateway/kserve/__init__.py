"""KServe v2 without a protocol: the data plane both front ends call, and the operations it serves beside
inference. The codec it parses and encodes with is gateway/codec/ (which imports nothing of this folder).

dataplane       lookup, readiness, submit and await, counters, failures, access line, span: once
infer_call      one infer request's context (`with plane.call(...)`): its steps, finished once on leaving it
repository      Triton's model repository extension: index, load, unload
shared_memory   Triton's system shared-memory extension's operations (register, status, unregister)
auth            the server's API key
"""
