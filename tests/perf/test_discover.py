"""Wall-clock bounds of the discover layer: the ld cache reader on big and hostile input."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nvct.base.errors import CacheError
from nvct.discover import ldcache
from tests.discover.test_ldcache import (
    NEW_MAGIC,
    OLD_MAGIC,
    VALID,
    X86_64,
    new_cache,
    overlapping_cache,
    parses_or_fails_cleanly,
)

HOSTILE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _within_a_second(data: bytes) -> None:
    start = time.perf_counter()
    parses_or_fails_cleanly(data)
    assert time.perf_counter() - start < 1


def test_overlapping_strings_are_refused_quickly():
    data = overlapping_cache()
    start = time.perf_counter()
    with pytest.raises(CacheError, match="overlap"):
        ldcache.parse(data)
    assert time.perf_counter() - start < 2


@HOSTILE
@given(st.one_of(st.binary(max_size=2048),
                 st.tuples(st.sampled_from([NEW_MAGIC, OLD_MAGIC]), st.binary(max_size=2048)).map(b"".join)))
def test_hostile_bytes_are_parsed_or_refused_within_a_second(data):
    """The unit tests (tests/discover/test_ldcache.py) hold what comes out; this, how long it takes."""
    _within_a_second(data)


@pytest.mark.parametrize("data", VALID, ids=["new", "old", "compat"])
def test_every_truncation_within_a_second(data):
    for size in range(0, len(data), 7):
        _within_a_second(data[:size])


def test_thousand_entries_parse_quickly():
    entries = [(X86_64, f"libx{i}.so.1", f"/usr/lib/x86_64-linux-gnu/libx{i}.so.1") for i in range(1000)]
    data = new_cache(entries)
    ldcache.parse(data)
    start = time.perf_counter()
    for _ in range(10):
        assert len(ldcache.parse(data)) == 1000
    assert (time.perf_counter() - start) / 10 < 0.05  # ~1 ms here; generous for slow CI
