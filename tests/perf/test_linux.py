"""Wall-clock bounds of the linux layer: the ELF reader on damaged files."""

from __future__ import annotations

import shutil
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.linux.test_elf import damage, libs, read_or_refuse, sample  # noqa: F401 (fixtures)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_damaged_file_is_read_or_refused_within_a_second(sample, data):
    damaged = damage(sample, data)
    start = time.perf_counter()
    read_or_refuse(damaged)
    assert time.perf_counter() - start < 1
