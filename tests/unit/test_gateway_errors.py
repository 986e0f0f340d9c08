"""gateway/core/errors.py: what an error message quotes of a client's value (echo)."""
from __future__ import annotations

from ringserve.gateway.core.errors import ECHO_MAX_CHARS, ModelNotFound, NoRoute, UnsupportedEncoding, echo


def test_a_short_value_is_quoted_as_its_repr():
    assert echo("mlp") == "'mlp'" and echo("mlp", quoted=False) == "mlp"
    assert echo([1, 3]) == "[1, 3]" and echo(None) == "None" and echo(b"\x00") == "b'\\x00'"
    assert echo("a" * ECHO_MAX_CHARS) == repr("a" * ECHO_MAX_CHARS)


def test_a_long_value_is_cut_after_200_characters_with_an_ellipsis():
    assert echo("a" * (1 << 20)) == repr("a" * 200) + "…"
    assert echo("a" * (1 << 20), quoted=False) == "a" * 200 + "…"
    assert echo(b"b" * 1000) == repr(b"b" * 200) + "…"
    shape = echo(list(range(1 << 20)))  # reprlib: never the repr of a million numbers
    assert shape.startswith("[0, 1, 2, ") and shape.endswith("…") and len(shape) == ECHO_MAX_CHARS + 1
    assert len(echo({"k": ["x" * 10_000] * 100})) == ECHO_MAX_CHARS + 1


def test_the_errors_that_quote_a_clients_name_or_path_quote_it_through_echo():
    for message in (str(ModelNotFound("m" * 10_000, "9" * 10_000, ["mlp"])), str(NoRoute("GET", "/" + "p" * 10_000)),
                    str(UnsupportedEncoding("e" * 10_000))):
        # (Triton's phrase names the model and version, then ringserve's detail again: each cut, twice at most)
        assert len(message) < 4 * (ECHO_MAX_CHARS + 3) + 200 and "…" in message, message[:300]
