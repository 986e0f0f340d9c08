"""Triton's logging and trace extensions, protocol-neutral: the checks of a request (with Triton's words,
server src/http_server.cc HandleLogging/HandleTrace and src/grpc/grpc_server.cc), the answers' values, and
the change itself, which the supervisor makes for every process (common/runtime_settings.py).

HTTP (gateway/http/settings_routes.py) and gRPC (gateway/grpc/settings.py) turn their wire format into
a dict of setting -> value and back; a value's type is checked by the front end (the words differ).

Where ringserve answers otherwise than Triton (docs/manual.md "Runtime log and trace settings"):
- log_file stays "" (refused, as Triton refuses it over the network); log_format also takes "json";
- trace_mode is "opentelemetry" (Triton's trace files, trace_mode triton, are not made): trace_file is
  refused as Triton refuses it, log_frequency (a trace-file setting) is refused but for 0 or null;
- trace_level TENSORS is refused (spans carry times, not tensors), and so is an unknown level or setting,
  which Triton skips silently; a wrongly typed value is 400 (Triton's JSON reader answers 500 there), and
  an unknown log_format 400 (Triton's HTTP: 503).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from ringserve.common import runtime_settings, tracing
from ringserve.common.runtime_settings import (
    LOG_FORMATS,
    TRACE_MODE,
    ChangeRuntimeSettings,
    RuntimeSettings,
)
from ringserve.gateway.cluster.peers import SCOPE_GATEWAY, Peers
from ringserve.gateway.core.errors import BadRequest, GatewayError, Unavailable, Unsupported, echo
from ringserve.gateway.core.settings import DispatchSettings

REVISION_PATH = "/v2/logging"  # with ?scope=gateway (peers only), its answer holds the gateway's revision too
PEERS_WAIT_S = 1.0
CONFIRM_S = 5.0  # the supervisor answers a change within a few ms; past this it is stuck or gone
LOG_SETTINGS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
LOG_SWITCHES = ("log_info", "log_warning", "log_error")
TRACE_SETTINGS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency")
UINT32_MAX, INT32_MAX = 2**32 - 1, 2**31 - 1
LOG_FILE_REFUSED = "log file location can not be updated through network protocol"
TRACE_FILE_REFUSED = "trace file location can not be updated through network protocol"
ONLY_OFF = "Expect only one trace level 'OFF' is specified"
_TOKENS = itertools.count()  # (HTTP's desk and gRPC's share the process)


# -- the log settings ----------------------------------------------------------------------------------
def log_values() -> dict[str, Any]:
    """This process's log settings (the same in every process once a change has reached it)."""
    settings = runtime_settings.current.log
    return {name: getattr(settings, name) for name in LOG_SETTINGS}


def check_log_change(values: dict[str, Any], format_word: str = "--log_format") -> dict[str, Any]:
    """The changes a request asks for (null: unchanged, as in Triton), types already checked by the front end.
    `format_word`: Triton's HTTP says '--log_format', its gRPC 'log_format'."""
    unknown = sorted(set(values) - set(LOG_SETTINGS))
    if unknown:
        raise BadRequest(f"unknown log setting {echo(unknown[0])}: expected one of {', '.join(LOG_SETTINGS)}")
    if values.get("log_file") is not None:
        raise Unsupported(LOG_FILE_REFUSED + " (every ringserve process logs to the server's stderr)")
    change = {name: value for name, value in values.items() if value is not None and name != "log_file"}
    level = change.get("log_verbose_level")
    if level is not None and not 0 <= level <= INT32_MAX:
        raise BadRequest("attempt to access JSON non-unsigned-integer as unsigned-integer")
    log_format = change.get("log_format")
    if log_format is not None and log_format not in LOG_FORMATS:
        raise BadRequest(
            f"invalid argument for {format_word}, got: {log_format[:100]} (expected {', '.join(LOG_FORMATS)})"
        )
    return change


def check_log_type(name: str, value: Any, words: str = "http") -> None:
    """Triton's type check of one log setting: its HTTP JSON reader's words, or its gRPC handler's."""
    if value is None or name not in LOG_SETTINGS:
        return
    expected = bool if name in LOG_SWITCHES else int if name == "log_verbose_level" else str
    if type(value) is expected:
        return
    if words == "grpc":
        kind = {bool: "boolean", int: "int32", str: "string"}[expected]
        raise BadRequest(f"expect {kind} for '{name}'")
    raise BadRequest(
        {
            bool: "attempt to access JSON non-boolean as boolean",
            int: "attempt to access JSON non-unsigned-integer as unsigned-integer",
            str: "attempt to access JSON non-string as string",
        }[expected]
    )


# -- the trace settings --------------------------------------------------------------------------------
def trace_values(model: str | None) -> dict[str, list[str] | str]:
    """A model's trace settings (its own, else the global ones), as Triton writes them in opentelemetry mode:
    strings, trace_level a list; trace_count is what this gateway has left to trace."""
    settings = runtime_settings.current.trace_of(model)
    values: dict[str, list[str] | str] = {
        "trace_level": list(settings.trace_level),
        "trace_rate": str(settings.trace_rate),
        "trace_count": str(runtime_settings.sampler.count_left(model)),
        "trace_mode": TRACE_MODE,
    }
    if tracing.active is not None:
        values["url"] = tracing.active.url
    return values


def check_trace_change(values: dict[str, list[str] | None]) -> dict[str, Any]:
    """The changes a request asks for. Each value is its strings (a list; HTTP's lone string made one), or
    None to clear it: a model's own setting gives way to the global one; the global one returns to the flags'."""
    unknown = sorted(set(values) - set(TRACE_SETTINGS))
    if unknown:
        raise BadRequest(f"unknown trace setting {echo(unknown[0])}: expected one of {', '.join(TRACE_SETTINGS)}")
    if "trace_file" in values:
        raise Unsupported(TRACE_FILE_REFUSED)
    change: dict[str, Any] = {}
    for name, strings in values.items():
        if strings is None:
            change[name] = None
        elif name == "trace_level":
            if strings:  # (an empty list changes nothing, as in Triton)
                change[name] = _trace_level(strings)
        elif name == "log_frequency":
            if _number(name, strings, 0, UINT32_MAX) != 0:
                raise BadRequest(
                    "Unable to set 'log_frequency': it sets how often Triton writes its trace files (trace_mode "
                    f"triton); this server's trace_mode is {TRACE_MODE}, whose spans leave as they end"
                )
        else:
            low, high = (0, UINT32_MAX) if name == "trace_rate" else (-1, INT32_MAX)
            change[name] = _number(name, strings, low, high)
    if tracing.active is None and change.get("trace_level") not in (None, ("OFF",)):
        raise BadRequest(
            "tracing is off in this server: start it with --otel-endpoint (or $OTEL_EXPORTER_OTLP_ENDPOINT) "
            "and the otel extra to trace requests"
        )
    return change


def _trace_level(strings: list[str]) -> tuple[str, ...]:
    if "OFF" in strings:
        if len(strings) > 1:
            raise BadRequest(ONLY_OFF)
        return ("OFF",)
    for level in strings:
        if level == "TENSORS":
            raise BadRequest(
                "trace level TENSORS is not supported: this server's spans (OpenTelemetry) carry times, not tensors"
            )
        if level != "TIMESTAMPS":
            raise BadRequest(f"unknown trace level {echo(level)}: expected OFF or TIMESTAMPS")
    return ("TIMESTAMPS",)


def _number(name: str, strings: list[str], low: int, high: int) -> int:
    text = strings[0] if len(strings) == 1 else ",".join(strings)
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"Unable to parse '{name}', got: {text[:100]}") from None
    if name == "trace_count" and value < low:
        raise BadRequest(f"Unable to parse 'trace_count'. Expecting value >= {low}, got:{text[:100]}")
    if not low <= value <= high:
        raise BadRequest(f"Unable to parse '{name}', value is out of range [ {low}, {high} ], got: {text[:100]}")
    return value


# -- the change -----------------------------------------------------------------------------------------
class SettingsLink(Protocol):
    """What the desk needs of the dispatcher (gateway/dispatch/dispatcher.py): who it is, the supervisor, and
    the list of those who hear each RuntimeSettings the supervisor sends."""

    settings: DispatchSettings
    on_runtime_settings: list[Callable[[RuntimeSettings], None]]

    def tell_supervisor(self, message: ChangeRuntimeSettings) -> bool: ...


class SettingsDesk:
    """Sends a checked change to the supervisor and waits for its answer: by then this gateway has applied it
    (the answer is the new state), and every other gateway has been sent it at the same moment."""

    def __init__(self, dispatcher: SettingsLink, peers: Peers | None = None) -> None:
        self.dispatcher, self.peers = dispatcher, peers
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.listening = False  # (registered at the first change: a front end built over a fake needs none)

    async def change(
        self, log: dict[str, Any] | None = None, trace: dict[str, Any] | None = None, model: str = ""
    ) -> None:
        if not log and not trace:
            return  # (Triton's POST of {}: the settings as they are)
        if not self.listening:
            self.dispatcher.on_runtime_settings.append(self.heard)
            self.listening = True
        gateway = self.dispatcher.settings.gateway
        token = f"{gateway}.{os.getpid()}.{next(_TOKENS)}"
        answered = self.waiting[token] = asyncio.get_running_loop().create_future()
        try:
            if not self.dispatcher.tell_supervisor(
                ChangeRuntimeSettings(token, gateway, log or {}, trace or {}, model)
            ):
                raise Unavailable("the gateway is not connected to the supervisor yet")
            await asyncio.wait_for(answered, CONFIRM_S)
        except TimeoutError:
            raise Unavailable(f"the supervisor did not confirm the settings within {CONFIRM_S:.0f} s") from None
        finally:
            self.waiting.pop(token, None)
        await self.until_peers_have(runtime_settings.current.revision)

    async def until_peers_have(self, revision: int) -> None:
        """Until every other gateway has applied `revision` (they heard it from the supervisor when this one
        did; a loaded one's loop may take a moment): then a client's next request, whichever gateway takes it,
        reads what it set. A peer that does not answer (restarting) is not waited for: it reads the file."""
        if self.peers is None:
            return
        deadline = asyncio.get_running_loop().time() + PEERS_WAIT_S
        while True:
            answers = await self.peers.get(f"{REVISION_PATH}?scope={SCOPE_GATEWAY}")
            behind = [a for a in answers if a.ok and orjson.loads(a.body).get("revision", revision) < revision]
            if not behind or asyncio.get_running_loop().time() > deadline:
                return
            await asyncio.sleep(0.005)

    def heard(self, message: RuntimeSettings) -> None:
        answered = self.waiting.get(message.token)
        if answered is not None and not answered.done():
            answered.set_result(None)

    def check_model(self, plane: Any, model: str) -> None:
        """Triton's words for a model that is not ready (or not known)."""
        try:
            plane.check_serving(plane.lookup(model, None))
        except GatewayError:
            raise BadRequest(f"Request for unknown model : {model}") from None
