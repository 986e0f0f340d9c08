"""The gateway's side of the workers: batches out to them, results and lifecycle reports back.

dispatcher    the parts put together; each worker and supervisor message routed to its part
scheduler     batches formed and sent to idle workers; it holds admission and replies (each an object):
admission     a request's model available now? into its queue, with its deadlines
replies       results, streamed responses and errors back to each request of a batch
recovery      batches that did not simply succeed: requeue, bisection, quarantine
answers       each accepted request answered exactly once, in order when asked
fleet         the worker processes: generations, successors, standbys, what each holds
catalog       model configs, versions, one queue per model key, a reload's swaps
model_states  model versions' lifecycle states, from the workers' reports
model_control explicit mode's loads and unloads: the served repository changed, a reload waited for
link          the ZeroMQ sockets (the only gateway module that imports zmq)
worker_port   the sockets as the scheduler sees them (a typing.Protocol; tests pass a fake)
"""
