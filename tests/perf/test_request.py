"""Wall-clock bounds of the request layer (tests/request holds what it does; this file how fast)."""

from __future__ import annotations

import time

from hypothesis import given, settings, strategies as st

from nvct.request.requirements import check
from tests.request.test_requirements import _ALPHABET, _FACTS, CUDA_12_4, facts, parse_or_refuse


def test_check_is_fast():
    env = {"NVIDIA_REQUIRE_CUDA": CUDA_12_4, "CUDA_VERSION": "12.4.1", "PATH": "/bin"}
    two = facts(cuda="12.2", driver="535.104.05", devices=[("9.0", "tesla"), ("9.0", "tesla")])
    start = time.perf_counter()
    for _ in range(100):
        check(env, two)
    assert (time.perf_counter() - start) / 100 < 0.01


@settings(max_examples=300, deadline=None)
@given(st.lists(_ALPHABET, max_size=300).map("".join), _FACTS)
def test_arbitrary_text_is_parsed_or_refused_within_a_second(text, driver_facts):
    start = time.perf_counter()
    parse_or_refuse(text, driver_facts)
    assert time.perf_counter() - start < 1
