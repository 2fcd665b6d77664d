from __future__ import annotations

from tests.support.cri import read_cri_log


def test_cri_log_lines_are_split_by_stream_and_partials_joined(tmp_path):
    log = tmp_path / "app.log"
    log.write_text(
        "2024-01-01T00:00:00.000000001Z stdout F hi\n"
        "2024-01-01T00:00:00.000000002Z stderr P par\n"
        "2024-01-01T00:00:00.000000003Z stderr F tial line\n"
        "2024-01-01T00:00:00.000000004Z stdout F \n"
        "garbage\n")
    assert read_cri_log(str(log)) == ("hi\n\n", "partial line\n")


def test_missing_log_is_empty(tmp_path):
    assert read_cri_log(str(tmp_path / "none.log")) == ("", "")
