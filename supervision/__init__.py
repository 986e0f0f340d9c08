"""The supervisor's parts; `supervisor.py` (the Supervisor and its loop) puts them together.

One module per idea, each run only in the supervisor process: `startup` (checks before anything
is made), `children` (one child process and what outlives it), `events` (the gateways' event
sockets), `quarantine` (models the server will not serve), `rings` and `listeners` (what the
gateways are handed), `workers` and `gateways` (starting, reaping and restarting each role).
"""
