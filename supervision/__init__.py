"""The supervisor's parts; `supervisor.py` (the Supervisor and its loop) puts them together.

One module per idea, each run only in the supervisor process: `startup` (checks before anything is
made), `children` (one child process, what outlives it, the table of them all), `events` (the
gateways' event sockets), `quarantine` (models the server will not serve), `listeners` (the sockets
the gateways are handed), `spares` (the warm spare worker of each device), `workers` and `gateways`
(starting, reaping and restarting each role; a gateway's rings), `hang_watch` (a worker's beats and
its calls into model code judged: hung, past a bound, silent), `repository_poll` (poll mode's look
at the repository), `runtime_settings` (a client's change of the log and trace settings, made in every
process), `health` (what the supervisor tells systemd, and the gateway health probe it is
decided from) and `sdnotify` (systemd's service protocol without libsystemd).
"""
