"""The HTTP front end (KServe v2 with Triton's extensions): wire format in, the data plane's outcome out.

app            the ASGI application: the API key check, the raw infer path in front of Starlette
routes         every route handler; the infer path (raw ASGI) and the body reader
shm_routes     Triton's shared-memory extensions' routes (over kserve/shared_memory)
generate       Triton's generate extension: /generate and /generate_stream (server-sent events), raw ASGI
streams        one request's responses as an async iterator, for any route that streams them to its client
settings_routes  Triton's logging and trace extensions' routes (over cluster/runtime_settings)
server_routes  /metrics and /admin/status for the whole server (every gateway's merged)
responses      how a Starlette endpoint answers: JSON, a GatewayError, `?scope=`
openapi        the OpenAPI document served at /openapi.json
engine         which HTTP engine serves (--http-engine) and uvicorn's public Server that runs it
fast           the fast path, the only module on uvicorn's private names: its httptools protocol (one
               send() per response, the request head's limits), the one-write answer, its version window
limits         what both engines share: a connection's limits, the scope key of a request's arrival
"""
