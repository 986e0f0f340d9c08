"""The supervisor's parts; `supervisor.py` (the Supervisor and its loop) puts them together.

Run only in the supervisor process: `startup` (checks before anything is made, and the sweep
of earlier runs), `children` (one child process and what outlives it).
"""
