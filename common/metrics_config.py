"""`--metrics-config <setting>=<value>`, as tritonserver takes it (server src/command_line_parser.cc's
ParseMetricsConfigOption, core src/metric_model_reporter.cc's MetricReporterConfig::ParseConfig).

Triton's settings, each a global one (no `<name>,` prefix: tritonserver refuses one):

    counter_latencies=false   no nv_inference_{request,queue,compute_*}_duration_us counters (default true)
    histogram_latencies=true  nv_inference_first_response_histogram_ms (default false)
    summary_latencies=true    the nv_inference_*_summary_us summaries (default false)
    summary_quantiles=0.5:0.05,0.9:0.01,...  their quantiles, <quantile>:<error> pairs; a pair that does
                              not parse is skipped, as Triton's (its QA writes `0.1:0.0.1`: std::stod reads
                              the leading number, 0.0); none left: the defaults

ringserve's own two, prometheus-cpp's fixed values by default (Triton's summaries are prometheus-cpp's):

    summary_max_age=60        seconds of requests the quantiles cover
    summary_age_buckets=5     the window slides in max_age / age_buckets steps

A setting name of neither list is refused by name (Triton keeps and ignores it: a misspelt
`summary_latency=true` would serve no summary in silence).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, SettingError

log = logging.getLogger(__name__)

# prometheus-cpp's defaults, as Triton's MetricReporterConfig sets them (metric_model_reporter.h).
DEFAULT_QUANTILES = ((0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001))
BOOLEAN_SETTINGS = ("counter_latencies", "histogram_latencies", "summary_latencies")
SETTINGS = (*BOOLEAN_SETTINGS, "summary_quantiles", "summary_max_age", "summary_age_buckets")
_LEADING_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")  # what std::stod reads


@dataclass(frozen=True)
class MetricsConfig:
    counter_latencies: bool = True
    histogram_latencies: bool = False
    summary_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    summary_max_age_s: float = 60.0
    summary_age_buckets: int = 5


FIRST_RESPONSE_FAMILY = "nv_inference_first_response_histogram_ms"


def first_response_buckets(model_metrics: Any) -> tuple[float, ...] | None:
    """A model config's `model_metrics` bucket override of the first-response histogram (None: Triton's
    buckets), checked as Triton's ValidateModelMetrics checks it (core src/model_config_utils.cc). A
    metric_control of another family is left alone (Triton warns that it is not customizable)."""
    found = None
    controls = (model_metrics or {}).get("metric_control", ())
    for control in [controls] if isinstance(controls, dict) else controls:
        if "metric_identifier" not in control:
            raise ConfigError(None, "model_metrics", "metric control must specify 'metric_identifier'")
        family = control["metric_identifier"].get("family", "")
        if not family:
            raise ConfigError(None, "model_metrics", "metric identifier must specify non-empty 'family'")
        if "histogram_options" not in control:
            raise ConfigError(None, "model_metrics", "metric control must specify 'histogram_options'")
        buckets = control["histogram_options"].get("buckets") or []
        if not buckets:
            raise ConfigError(None, "model_metrics", "histogram options must specify non-empty 'buckets'")
        if family == FIRST_RESPONSE_FAMILY:
            found = tuple(sorted(float(b) for b in buckets))
    return found


def split_setting(arg: str) -> tuple[str, str]:
    """One `--metrics-config` value as (setting, value); SettingError in tritonserver's words."""
    setting, _, value = arg.partition("=")
    if not _ or "," in setting or not setting or not value:
        raise SettingError("metrics_config", f"--metrics-config option format is <setting>=<value>. Got {arg}")
    return setting, value


def parse_metrics_config(args: Iterable[str]) -> MetricsConfig:
    """The settings of every `--metrics-config` given, in order (a later one of a name wins)."""
    values: dict[str, object] = {}
    for arg in args:
        setting, value = split_setting(arg)
        if setting in BOOLEAN_SETTINGS:
            if value not in ("true", "false"):
                raise SettingError("metrics_config", f"{setting}: true or false, not {value!r}")
            values[setting] = value == "true"
        elif setting == "summary_quantiles":
            quantiles = parse_quantiles(value)
            if quantiles:
                values[setting] = quantiles
        elif setting == "summary_max_age":
            values["summary_max_age_s"] = _positive(setting, value, float)
        elif setting == "summary_age_buckets":
            values[setting] = _positive(setting, value, int)
        else:
            raise SettingError("metrics_config", f"unknown setting {setting!r}: one of {', '.join(SETTINGS)}")
    return MetricsConfig(**values)  # type: ignore[arg-type]


def parse_quantiles(text: str) -> tuple[tuple[float, float], ...]:
    """`<quantile>:<error>,...` as Triton's ParseQuantiles reads it: a bad pair is logged and skipped."""
    pairs = []
    for pair in text.split(","):
        quantile, colon, error = pair.partition(":")
        q, e = _stod(quantile), _stod(error)
        if not colon or q is None or e is None:
            log.error("Invalid option: [%s]. Expected format is <quantile>:<error>", pair)
            continue
        if not 0.0 <= q <= 1.0:
            raise SettingError("metrics_config", f"summary_quantiles: quantile {q} is not within [0, 1]")
        pairs.append((q, e))
    return tuple(pairs)


def _stod(text: str) -> float | None:
    found = _LEADING_NUMBER.match(text)
    return float(found.group(0)) if found else None


def _positive(setting: str, value: str, kind: type) -> float:
    try:
        number = kind(value)
    except ValueError:
        raise SettingError("metrics_config", f"{setting}: a number, not {value!r}") from None
    if number <= 0:
        raise SettingError("metrics_config", f"{setting}: must be > 0, not {value!r}")
    return number
