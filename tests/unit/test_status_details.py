"""Status details stay within gRPC's metadata limit, whatever the caller sent to be echoed."""

from __future__ import annotations

import pytest

from asyncdapo.runtime.status_details import DETAILS_BYTES, SHOWN_CHARS, bounded_details, shown


def test_a_short_value_is_shown_whole_and_a_long_one_cut_with_its_length() -> None:
    assert shown("t") == "'t'"
    long = shown("x" * 70_000)
    assert long.startswith(repr("x" * SHOWN_CHARS)) and long.endswith("(70000 characters)")


@pytest.mark.parametrize("char", ["x", "é", "\U0010aa1f"])
def test_bounded_details_fit_the_metadata_limit_percent_encoded(char: str) -> None:
    message = bounded_details("run " + char * 70_000)
    # gRPC sends the details percent-encoded: 3 bytes per non-ASCII byte; 8 KiB is its soft limit
    assert len(message.encode()) <= DETAILS_BYTES + 64
    assert 3 * len(message.encode()) < 8192 and message.endswith("70004 characters in all)")
    assert bounded_details("short") == "short"
