"""OpenAI-compatible routes under /v1, over the same data plane as /infer (gateway/kserve/dataplane.py).

A request to /v1/completions, /v1/chat/completions or /v1/embeddings becomes one KServe v2 inference
request (or, for a list of texts to embed, one per text) of a model of the repository, mapped as
Triton's OpenAI frontend maps its Python and ensemble models: `text_input` in, `max_tokens`,
`stream` and the sampling parameters as inputs where the model declares them (else as request
parameters), `text_output` out; `num_input_tokens` and `num_output_tokens` outputs give usage.
So batching, lanes, requeue after a worker death and crash isolation are the ones every request has.

    errors     OpenAI's error shape {"error": {message, type, param, code}} for every GatewayError
    requests   the bodies OpenAI's clients send, read and checked (400 with the field's name)
    mapping    a request -> the model's KServe v2 request document; its outputs -> text and usage
    chat       messages -> one prompt: the model's tokenizer chat template, or the documented default
    stream     one request's responses as they come (the data plane's stream callback), and the event stream
    routes     the Starlette routes; streaming answers as OpenAI's server-sent events ending `[DONE]`
    openapi    their entries in /openapi.json
"""
