"""The few strings that message and record fields take, each family as one `Literal`, shared from here.

mypy checks a field annotated with one of these against what is written to it; the frozensets
beside them are for the code that checks a value at run time.
"""

from __future__ import annotations

from typing import Literal, get_args

# Why a batch never ran: the gateway answers these 503 without blaming (bisecting) a request.
ErrorKind = Literal["budget", "load_failed", "not_served"]
ERROR_KINDS_NOT_RUN: frozenset[str] = frozenset(get_args(ErrorKind))

SpareState = Literal["none", "starting", "ready"]  # a device's warm spare: none now, importing, primed
