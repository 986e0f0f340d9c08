"""Errors shared by every process: the root exception and config problems."""

from __future__ import annotations


class RingserveError(Exception):
    """Root of every error ringserve raises on purpose."""


class ConfigError(RingserveError):
    """A model repository or model config that ringserve cannot serve."""

    def __init__(self, model: str | None, field: str, problem: str) -> None:
        self.model = model
        self.field = field
        self.problem = problem
        where = f"model '{model}': " if model else ""
        super().__init__(f"{where}config field '{field}': {problem}")


class SettingError(ConfigError):
    """A server setting (a `ringserve serve` flag, or the settings file) that cannot work."""

    def __init__(self, field: str, problem: str) -> None:
        RingserveError.__init__(self, f"setting '{field}': {problem}")
        self.model = None
        self.field = field
        self.problem = problem
