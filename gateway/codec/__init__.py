"""The KServe v2 codec: a request document (JSON or binary) in, checked under every limit, and the response
document out. A leaf: it imports nothing of the data plane (gateway/kserve/) nor of the front ends, only the
request, errors and regions below it (pyproject.toml's contracts), so each front end and the plane share it.

parse           a request document (JSON or binary) -> InferRequest, under every limit
tensors         its input tensors: shapes, room in the slot, JSON data -> numpy, BYTES, regions
json_body       a JSON body's budget, counted before it is parsed; NaN and Infinity
outputs         its requested outputs: binary, classification, shared-memory regions
encode          an answered InferRequest -> the response document
binary          the binary tensor extension, Content-Encoding in and out
bounds          the largest tensor a request may carry, from its shape
classification  Triton's classification extension
"""
