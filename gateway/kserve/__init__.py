"""KServe v2 without a protocol: the data plane both front ends call, and what it is made of.

dataplane       lookup, readiness, submit and await, counters, failures, access line, span: once
parse           a request document (JSON or binary) -> InferRequest, under every limit
tensors         its input tensors: shapes, room in the slot, JSON data -> numpy, BYTES, regions
json_body       a JSON body's budget, counted before it is parsed; NaN and Infinity
outputs         its requested outputs: binary, classification, shared-memory regions
encode          an answered InferRequest -> the response document
binary          the binary tensor extension, Content-Encoding in and out
bounds          the largest tensor a request may carry, from its shape
classification  Triton's classification extension
repository      Triton's model repository extension: index, load, unload
shared_memory   Triton's system shared-memory extension's operations (register, status, unregister)
auth            the server's API key
"""
