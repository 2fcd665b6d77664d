"""Suite-wide settings: lanes, Hypothesis profiles, simulated GPU nodes.

Lanes (docs/contributing.md): ``containers`` marks a test that runs real
containers or container engines, ``root`` one that needs root without them.
Fixtures that start containers mark their users here, and a test that starts
a runtime or an engine without the ``containers`` mark fails, so the fast lane
(``-m "not containers"``) cannot grow a container test unnoticed.

As root the suite runs in a private mount namespace (tests.support.hostns): the
/run/nvct its programs write is its own, not the host's.

In CI (CI or NVCT_CI_NO_SKIP set) a skipped test is a failure and Hypothesis
is derandomized; ``--hypothesis-profile=dev`` or NVCT_HYPOTHESIS_PROFILE=dev
draws random examples.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading

import pytest
from hypothesis import settings

from tests.support import hostns
from tests.support.fixtures import skip

#: As root, the suite runs in a mount namespace of its own, with its own /run (tests.support.hostns):
#: what the shims, hooks and installers it starts write there never reaches the host's, nor
#: another test run's. Entered here, at collection, while pytest has one thread.
hostns.enter()

#: Hypothesis's own deadline is a wall-clock assertion: none here (timing goes in tests/perf).
settings.register_profile("dev", deadline=None)
#: The same examples on every run: a CI failure reproduces, a CI pass is not a lucky draw.
settings.register_profile("ci", deadline=None, derandomize=True, database=None, print_blob=True)
_CI = bool(os.environ.get("CI") or os.environ.get("NVCT_CI_NO_SKIP"))
settings.load_profile(os.environ.get("NVCT_HYPOTHESIS_PROFILE") or ("ci" if _CI else "dev"))

#: Fixtures (tests/support/fixtures.py) that run containers or start an engine.
CONTAINER_FIXTURES = frozenset({"oci_runtime", "private_dockerd", "private_containerd", "private_podman"})
#: Fixtures that need root but run no container.
ROOT_FIXTURES = frozenset({"sim_node", "sim_node_535", "sim_node_570", "sim_node_64"})
#: Programs that run a container or talk to an engine: the system's, not a test's fake of the same name.
_CONTAINER_PROGRAMS = frozenset({"runc", "crun", "ctr", "containerd", "dockerd", "docker", "podman",
                                 "conmon", "mmdebstrap"})
_SYSTEM_DIRS = ("/usr/", "/bin/", "/sbin/")
#: A first argument that asks for facts only.
_QUERIES = frozenset({"--version", "version", "--help", "help", "features", "spec"})
#: The support modules whose every process is part of running a container or an engine.
_CONTAINER_SUPPORT = tuple(os.path.join(os.path.dirname(__file__), "support", name + ".py")
                           for name in ("runtimes", "docker", "containerd", "podman", "noderoot", "cri"))

_TESTS = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: A skip's reason that says the test needs root ("needs root or user namespaces" does not).
_ROOT_REASON = re.compile(r"needs root\b(?! or)").match

_running: pytest.Item | None = None
_UNMARKED = pytest.StashKey[list]()


def _starts_a_container(args, env) -> str | None:
    """What a new process is, when it runs a container: its program, or the support module's function."""
    argv = [os.fsdecode(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)]
    program = argv[0] if argv and "/" in argv[0] else argv and shutil.which(argv[0], path=_path(env))
    if (program and os.path.basename(program) in _CONTAINER_PROGRAMS
            and os.path.realpath(program).startswith(_SYSTEM_DIRS) and not _query(argv[1:])):
        return " ".join(argv[:3])
    frame, called = sys._getframe(2), None
    while frame is not None:  # the outermost support function: the one the test called
        if frame.f_code.co_filename in _CONTAINER_SUPPORT:
            called = f"tests.support.{os.path.basename(frame.f_code.co_filename)[:-3]}.{frame.f_code.co_name}"
        frame = frame.f_back
    return called


def _path(env) -> str | None:
    if env is None:
        return os.environ.get("PATH")
    path = env.get("PATH", env.get(b"PATH"))
    return os.fsdecode(path) if path is not None else None


def _query(rest: list[str]) -> bool:
    """``runc --version``, ``containerd config dump``: facts, no container, no daemon."""
    return (bool(rest) and rest[0] in _QUERIES) or "config" in rest and ("dump" in rest or "default" in rest)


def _audit(event: str, args: tuple) -> None:
    item = _running
    if (event != "subprocess.Popen" or item is None or item.get_closest_marker("containers")
            or threading.current_thread() is not threading.main_thread()):  # a thread may outlive its test
        return
    what = _starts_a_container(args[1], args[3])
    if what:
        item.stash.setdefault(_UNMARKED, []).append(what)


sys.addaudithook(_audit)


@pytest.fixture(scope="session", autouse=True)
def _private_nvct_state(tmp_path_factory):
    """``nvct runtime configure`` lists what it configured for package removal
    (nvct.engines.configured): the suite's configs go to a list of its own."""
    os.environ["NVCT_STATE_DIR"] = str(tmp_path_factory.mktemp("nvct-state"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Mark by fixture before ``-m`` selects; a skip for non-root marks ``root``, and so does a test
    or fixture that asks for root (``need_root()``, a "needs root" skip, in it or a helper of the tests')."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & CONTAINER_FIXTURES:
            item.add_marker(pytest.mark.containers)
        params = getattr(getattr(item, "callspec", None), "params", {})  # a fixture's name as a parameter
        if (item.get_closest_marker("containers") or (names | {str(v) for v in params.values()}) & ROOT_FIXTURES
                or any("root" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif"))
                or any(_asks_for_root(f) for f in _functions(item))):
            item.add_marker(pytest.mark.root)


def _functions(item) -> list:
    """The test's function and its fixtures' (the ones that would set it up)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = [d[-1] for d in info.name2fixturedefs.values() if d] if info else []
    return [getattr(item, "function", None), *(d.func for d in defs)]


def _asks_for_root(function, depth: int = 3, _cache: dict = {}) -> bool:  # noqa: B006 (the cache)
    code = getattr(function, "__code__", None)
    if code is None or depth == 0:
        return False
    if code not in _cache:
        _cache[code] = False  # a cycle of helpers asks nothing more
        names, consts = set(code.co_names), list(code.co_consts)
        for const in code.co_consts:  # nested functions and lambdas
            names |= set(getattr(const, "co_names", ()))
            consts += getattr(const, "co_consts", ())
        called = [function.__globals__.get(name) for name in names]
        called = [f.__init__ if isinstance(f, type) else f for f in called]  # a class of the tests: its __init__
        _cache[code] = "need_root" in names or any(  # a "needs root" skip, request.getfixturevalue("sim_node")
            isinstance(c, str) and (_ROOT_REASON(c) or c in ROOT_FIXTURES) for c in consts) or any(
            _asks_for_root(f, depth - 1) for f in called
            if getattr(getattr(f, "__code__", None), "co_filename", "").startswith(_TESTS))
    return _cache[code]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _running
    _running = item
    try:
        yield
    finally:
        _running = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    unmarked = item.stash.get(_UNMARKED, None)
    if unmarked and report.when != "teardown":
        report.outcome = "failed"
        report.longrepr = (f"runs containers ({', '.join(sorted(set(unmarked)))}) without the containers mark:"
                           " add `pytestmark = pytest.mark.containers` to its module")
        unmarked.clear()
    if os.environ.get("NVCT_CI_NO_SKIP") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where nothing may be skipped: {reason}"


def _node(tmp_path_factory, **options):
    if os.geteuid() != 0:
        skip("needs root (builds a simulated GPU node with mknod)")
    from nvct.simulate.node import cached_node

    return cached_node(tmp_path_factory.getbasetemp() / "sim", **options)


@pytest.fixture(scope="session")
def sim_node(tmp_path_factory):
    """The default simulated node: DGX H100, driver 550.54.15, MIG on GPU 0 (two 3g.40gb)."""
    return _node(tmp_path_factory)


@pytest.fixture(scope="session")
def sim_node_535(tmp_path_factory):
    """Driver 535.161.08, no MIG."""
    return _node(tmp_path_factory, driver_version="535.161.08", mig=False)


@pytest.fixture(scope="session")
def sim_node_570(tmp_path_factory):
    """Driver 570.124.06 (open kernel module era), MIG on GPU 0."""
    return _node(tmp_path_factory, driver_version="570.124.06")


@pytest.fixture(scope="session")
def sim_node_64(tmp_path_factory):
    """The benchmark shape: 64 GPUs on synthetic buses."""
    return _node(tmp_path_factory, gpus=64)
