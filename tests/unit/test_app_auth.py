"""gateway/http/app.py: the API key in `Authorization: Bearer <key>`, its scheme in any case (RFC 7235)."""
from __future__ import annotations

import pytest

from ringserve.gateway.kserve.auth import ApiKey


@pytest.mark.parametrize("value", [b"Bearer s3cret", b"bearer s3cret", b"BEARER s3cret", b" Bearer   s3cret "])
def test_the_key_is_accepted_with_the_scheme_in_any_case(value):
    assert ApiKey("s3cret").refusal([(b"authorization", value)]) is None


@pytest.mark.parametrize("value", [b"Bearer wrong", b"Basic s3cret", b"s3cret", b"Bearers3cret", b"Bearer"])
def test_a_wrong_key_or_scheme_is_refused(value):
    refusal = ApiKey("s3cret").refusal([(b"authorization", value)])
    assert refusal is not None and "is wrong" in str(refusal)


def test_no_authorization_header_is_refused():
    assert "needs the server's API key" in str(ApiKey("s3cret").refusal([(b"host", b"x")]))
