"""The suite's own rules (docs/contributing.md, "Tests"), held by reading the tests and by running probes.

- synchronisation polls (``tests.support.proc.wait_for``), never a ``time.sleep`` of a guessed length;
- wall-clock assertions live in ``tests/perf``;
- a test that runs containers carries the ``containers`` mark, so ``-m "not containers"`` is a fast lane.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
#: The polling helpers themselves, and the place of timing.
EXEMPT = (TESTS / "support", TESTS / "perf")
#: A sleep that is not a synchronisation says so on its line.
NOT_SYNC = "not a synchronisation"
_CLOCKS = ("time.monotonic", "time.perf_counter", "time.time")


def _files() -> list[pathlib.Path]:
    return sorted(p for p in TESTS.rglob("*.py") if not any(p.is_relative_to(e) for e in EXEMPT))


def _calls(tree: ast.AST, names) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and ast.unparse(node.func) in names]


def test_no_sleep_stands_in_for_a_poll() -> None:
    sleeps = []
    for path in _files():
        lines = path.read_text().splitlines()
        sleeps += [f"{path.relative_to(TESTS.parent)}:{call.lineno}: {lines[call.lineno - 1].strip()}"
                   for call in _calls(ast.parse("\n".join(lines)), ("time.sleep",))
                   if NOT_SYNC not in lines[call.lineno - 1]]
    assert not sleeps, "poll with tests.support.proc.wait_for instead"


def test_no_assertion_reads_the_clock() -> None:
    timed = [f"{path.relative_to(TESTS.parent)}:{node.lineno}: {ast.unparse(node)}"
             for path in _files() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Assert) and _calls(node, _CLOCKS)]
    assert not timed, "a wall-clock bound goes in tests/perf"


def _probe(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """pytest on one probe module, under this suite's conftest."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    env.pop("NVCT_CI_NO_SKIP", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, "-q", *args, str(tmp_path / "test_probe.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not os.access("/usr/sbin/runc", os.X_OK), reason="needs runc")
def test_a_test_that_runs_a_runtime_without_the_mark_fails(tmp_path) -> None:
    proc = _probe(tmp_path, """
        import subprocess
        import pytest

        def test_unmarked(tmp_path):
            subprocess.run(["/usr/sbin/runc", "--root", str(tmp_path), "list"], capture_output=True)

        @pytest.mark.containers
        def test_marked(tmp_path):
            subprocess.run(["/usr/sbin/runc", "--root", str(tmp_path), "list"], capture_output=True)

        def test_version_only():
            subprocess.run(["/usr/sbin/runc", "--version"], capture_output=True)
    """)
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "test_unmarked" in proc.stdout and "without the containers mark" in proc.stdout


def test_container_fixtures_mark_their_tests_and_the_fast_lane_leaves_them_out(tmp_path) -> None:
    proc = _probe(tmp_path, """
        from tests.support.fixtures import oci_runtime  # noqa: F401

        def test_with_a_runtime(oci_runtime):
            raise AssertionError("selected in the fast lane")

        def test_plain():
            pass
    """, "-m", "not containers")
    assert "1 passed, 2 deselected" in proc.stdout, proc.stdout + proc.stderr
