"""Unit tests of the checks of caller-supplied values other than paths.

Wrong types raise TypeError; right types with bad values raise InvalidArgument
(a ValueError and a PathLockError).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlock._core import validation
from pathlock._core.limits import NODE_ID_LENGTH, REASON_LENGTH
from pathlock.errors import InvalidArgument, PathLockError

PROPERTY = settings(max_examples=200, deadline=None)
YEAR = 365 * 24 * 3600.0


def test_invalid_argument_family() -> None:
    assert issubclass(InvalidArgument, PathLockError)
    assert issubclass(InvalidArgument, ValueError)


# -- customer_id -------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 42, 2**62, 2**63 - 1])
def test_customer_id_accepts_bigint_range(value: int) -> None:
    result = validation.customer_id(value)
    assert result == value
    assert type(result) is int


@pytest.mark.parametrize("value", [True, False, "1", "42", 1.0, None, b"1", [1]])
def test_customer_id_rejects_wrong_types(value: object) -> None:
    with pytest.raises(TypeError, match="customer_id must be an int"):
        validation.customer_id(value)


@pytest.mark.parametrize("value", [-1, -(2**63), 2**63, 2**64, 10**30])
def test_customer_id_rejects_out_of_range(value: int) -> None:
    with pytest.raises(InvalidArgument, match=str(value)):
        validation.customer_id(value)


@PROPERTY
@given(st.integers())
def test_customer_id_property(value: int) -> None:
    if 0 <= value <= 2**63 - 1:
        assert validation.customer_id(value) == value
    else:
        with pytest.raises(InvalidArgument):
            validation.customer_id(value)


# -- timeout -----------------------------------------------------------------------


def test_timeout_none_means_no_limit() -> None:
    assert validation.timeout(None) is None


def test_timeout_infinity_means_no_limit() -> None:
    assert validation.timeout(math.inf) is None


@pytest.mark.parametrize("value", [0, 0.0, 0.001, 1, 2.5, 600, 10**6])
def test_timeout_accepts_non_negative_numbers(value: float) -> None:
    result = validation.timeout(value)
    assert result == value
    assert type(result) is float


@pytest.mark.parametrize("value", [-1, -0.001, -math.inf, math.nan])
def test_timeout_rejects_bad_values(value: float) -> None:
    with pytest.raises(InvalidArgument, match="timeout"):
        validation.timeout(value)


@pytest.mark.parametrize("value", ["1", True, False, b"1", [1], 1j])
def test_timeout_rejects_wrong_types(value: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        validation.timeout(value)


@PROPERTY
@given(st.floats(min_value=0.0, allow_infinity=False))
def test_timeout_property(value: float) -> None:
    assert validation.timeout(value) == value


# -- ttl ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [validation.MIN_TTL, 0.01, 1, 30.0, 600, YEAR, validation.MAX_TTL]
)
def test_ttl_accepts_a_millisecond_to_a_year(value: float) -> None:
    result = validation.ttl(value)
    assert result == value
    assert type(result) is float


@pytest.mark.parametrize(
    "value",
    [
        0,
        0.0,
        -0.0,
        -1,
        0.0009,
        math.nan,
        math.inf,
        -math.inf,
        validation.MAX_TTL + 1,
        2 * YEAR,
        10**12,
    ],
)
def test_ttl_rejects_bad_values(value: float) -> None:
    with pytest.raises(InvalidArgument, match="ttl"):
        validation.ttl(value)


@pytest.mark.parametrize("value", ["30", True, None, b"1"])
def test_ttl_rejects_wrong_types(value: object) -> None:
    with pytest.raises(TypeError, match="ttl"):
        validation.ttl(value)


def test_ttl_limit_is_about_a_year() -> None:
    assert YEAR <= validation.MAX_TTL < 2 * YEAR


# -- reason ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "",
        "move",
        "x" * REASON_LENGTH,
        "line\nbreak\ttab",
        "caf\u00e9 \U0001f600",
        "\u00e9" * REASON_LENGTH,
    ],
)
def test_reason_accepts_text(value: str) -> None:
    assert validation.reason(value) == value


def test_reason_length_is_a_thousand() -> None:
    assert REASON_LENGTH == 1000
    assert validation.reason("x" * 1000) == "x" * 1000
    with pytest.raises(InvalidArgument, match="longer than 1000"):
        validation.reason("x" * 1001)


@pytest.mark.parametrize("value", [None, 1, b"move", ["move"]])
def test_reason_rejects_non_str(value: object) -> None:
    with pytest.raises(TypeError, match="reason must be a str"):
        validation.reason(value)


@pytest.mark.parametrize("value", ["a\x00b", "\x00", "a\ud800", "\udfff", "ok\udc80"])
def test_reason_rejects_nul_and_surrogates(value: str) -> None:
    with pytest.raises(InvalidArgument, match="NUL or a lone surrogate"):
        validation.reason(value)


# -- node_id -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["web-1", "a", "node.example.com", "n" * NODE_ID_LENGTH, "n\u00f8de 1"]
)
def test_node_id_accepts_printable(value: str) -> None:
    assert validation.node_id(value) == value


def test_node_id_length_is_checked() -> None:
    assert NODE_ID_LENGTH == 255
    with pytest.raises(InvalidArgument, match="1 to 255"):
        validation.node_id("")
    with pytest.raises(InvalidArgument, match="1 to 255"):
        validation.node_id("n" * 256)


@pytest.mark.parametrize("value", ["a\x00", "a\nb", "\t", "a\x7f", "a\x85", "a\x9f", "a\ud800"])
def test_node_id_rejects_control_characters_and_surrogates(value: str) -> None:
    with pytest.raises(InvalidArgument, match="control characters or surrogates"):
        validation.node_id(value)


@pytest.mark.parametrize("value", [None, 1, b"web-1"])
def test_node_id_rejects_non_str(value: object) -> None:
    with pytest.raises(TypeError, match="node_id must be a str"):
        validation.node_id(value)
