"""The README's flags table and error table stay true to the code: every `serve` flag has a row,
every row names a flag that exists, and every status code the gateway sends has a row."""
from __future__ import annotations

import re
from pathlib import Path

from ringserve.cli import build_parser
from ringserve.gateway.core.errors import HTTP_STATUS

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def table_after(heading_text: str, first_cell: str) -> list[str]:
    """The rows of the first Markdown table after `heading_text` whose header starts with `first_cell`."""
    start = README.index(heading_text)
    header = README.index(f"| {first_cell} |", start)
    rows = []
    for line in README[header:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def serve_flags() -> set[str]:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    return {option for action in serve._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"}


FLAG_ROWS = table_after("## Serving your own models", "flag")
ERROR_ROWS = table_after("Errors are JSON", "code")


def test_every_serve_flag_has_a_row_in_the_flags_table():
    in_table = {flag for row in FLAG_ROWS for flag in re.findall(r"--[a-z][a-z0-9-]*", row.split("|")[1])}

    missing = serve_flags() - in_table

    assert not missing, f"README's flags table lacks {sorted(missing)}"


def test_every_flag_in_the_flags_table_exists():
    in_table = {flag for row in FLAG_ROWS for flag in re.findall(r"--[a-z][a-z0-9-]*", row.split("|")[1])}

    unknown = in_table - serve_flags()

    assert not unknown, f"README's flags table names flags `serve` does not have: {sorted(unknown)}"


def test_every_status_the_gateway_sends_has_a_row_in_the_error_table():
    codes = {int(match) for row in ERROR_ROWS for match in re.findall(r"^\| (\d{3})", row)}

    missing = set(HTTP_STATUS.values()) - codes

    assert len(ERROR_ROWS) >= 8 and not missing, f"README's error table lacks {sorted(missing)}"
