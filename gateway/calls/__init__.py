"""The workers' front end: a worker's request to a model it does not hold (a BLS call or an ensemble's step
whose model runs in another lane), served on the data plane as an HTTP request is, without the HTTP.

front   CALL (a KServe v2 binary body) -> the data plane -> CALL_REPLY (worker/calls.py is the other end)
stream  a stream CALL (exec(decoupled=True)): a CALL_REPLY per response as the model sends it; CALL_CANCEL
"""
