"""Python models' custom metrics (pb_utils.MetricFamily) in /metrics, beside the server's own.

Each worker publishes its families in a file of the runtime dir (common/model_metrics.py); the gateway
that answers /metrics for the whole server reads the live workers' files at scrape time and writes one
family per name, as Triton would with every model instance in one server process:

- COUNTER and HISTOGRAM series of the same labels are added up over the workers (in Triton every
  instance's Metric of those labels is one series, which each increments).
- GAUGE: the value of the worker that changed it last (in Triton the instances set one series).
- A family's description and kind are the first worker's (by index); one of the same name with another
  kind, or a name the server's own families use, is left out.

Written as Triton (prometheus-cpp) writes them: a counter's series carry the family's name, no `_total`
(Triton's custom_metrics example looks for `requests_process_latency_ns{model=...}`). A gateway's
?scope=gateway share holds none of them: they are the server's, written once by the answering gateway.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ringserve.common import model_metrics


def exposition(runtime_dir: str, reserved: Iterable[str]) -> bytes:
    """The workers' families as exposition text (b"" when no model made one)."""
    families = merge(snapshot for _, snapshot in model_metrics.read_live(runtime_dir))
    taken = set(reserved)
    return "".join(_text(f) for f in families if f["name"] not in taken).encode()


def merge(snapshots: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One family per name over the workers' snapshots (see the module's docstring)."""
    merged: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        for family in snapshot.get("families", ()):
            mine = merged.get(family["name"])
            if mine is None:
                mine = merged[family["name"]] = {**family, "series": {}}
            elif mine["kind"] != family["kind"]:
                continue
            for series in family["series"]:
                _add(mine["kind"], mine["series"], series)
    for family in merged.values():
        family["series"] = list(family["series"].values())
    return list(merged.values())


def _add(kind: str, into: dict[tuple, dict[str, Any]], series: dict[str, Any]) -> None:
    key = tuple(sorted(series["labels"].items()))
    mine = into.get(key)
    if mine is None:
        into[key] = {**series, "counts": list(series.get("counts", ()))}
    elif kind == "counter":
        mine["value"] += series["value"]
    elif kind == "gauge":
        if series["updated"] > mine["updated"]:
            into[key] = series
    elif mine["buckets"] == series["buckets"]:  # (a histogram of other buckets cannot be added: the first stays)
        mine["counts"] = [a + b for a, b in zip(mine["counts"], series["counts"])]
        mine["sum"] += series["sum"]
        mine["count"] += series["count"]


def _text(family: dict[str, Any]) -> str:
    name, kind = family["name"], family["kind"]
    lines = [f"# HELP {name} {escape_help(family['description'])}\n", f"# TYPE {name} {kind}\n"]
    for series in family["series"]:
        labels = sorted(series["labels"].items())
        if kind != "histogram":
            lines.append(f"{name}{_labels(labels)} {prometheus_value(series['value'])}\n")
            continue
        cumulative = 0
        for bound, count in zip([*series["buckets"], math.inf], series["counts"]):
            cumulative += count
            lines.append(f"{name}_bucket{_labels([*labels, ('le', prometheus_value(bound))])} {cumulative}\n")
        lines.append(f"{name}_sum{_labels(labels)} {prometheus_value(series['sum'])}\n")
        lines.append(f"{name}_count{_labels(labels)} {series['count']}\n")
    return "".join(lines)


def _labels(labels: list[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{escape_label(value)}"' for key, value in labels) + "}"


def prometheus_value(value: float) -> str:
    """A sample's value as Triton (prometheus-cpp) writes it; gateway/cluster/triton_metrics.py writes with it too."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))  # (as prometheus-cpp writes a whole number: digits only)
    return repr(float(value))


def escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
