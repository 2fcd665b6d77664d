"""The doctor as a whole: a healthy node is all ok, nothing is written, output is one line per finding."""

from __future__ import annotations

import json
import os

from nvct import doctor
from nvct.doctor import FAIL, Finding

from .nodes import problems


def _tree(root: str) -> dict:
    """Every path under ``root`` with its type, size and mtime."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            st = os.lstat(path)
            out[path] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def test_a_healthy_node_is_all_ok(node):
    findings = node.doctor()
    assert problems(findings) == []
    assert doctor.exit_code(findings) == 0
    ids = {f.id for f in findings}
    for expected in ("config.file", "driver.module", "driver.version", "driver.gpus", "driver.nvml",
                     "devices.majors", "devices.nodes", "devices.modes", "devices.char-links",
                     "devices.persistence", "libraries.ldcache", "libraries.compute", "libraries.nvml",
                     "runtime.docker", "runtime.docker-gpus", "runtime.containerd", "runtime.crio",
                     "cdi.specs", "cdi.fresh", "cgroup.version"):
        assert expected in ids


def test_a_healthy_node_is_all_ok_when_deep(node):
    findings = node.doctor(deep=True)
    assert problems(findings) == []
    assert any(f.id == "driver.nvml-devices" and f.status == "ok" for f in findings)
    persistence = [f for f in findings if f.id == "devices.persistence"]
    assert persistence[0].status == "ok" and "on for all 8 GPU(s)" in persistence[0].seen


def test_doctor_changes_nothing(node):
    before = {root: _tree(root) for root in (node.tmp,)}
    node.doctor(deep=True)
    assert {root: _tree(root) for root in (node.tmp,)} == before


def test_text_has_one_line_per_finding_and_a_summary():
    findings = [Finding("a.b", "ok", "fine"), Finding("c.long-id", "fail", "broken\nacross lines", "do this")]
    lines = doctor.render_text(findings).splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["ok", "a.b", "fine"]
    assert lines[1] == "fail  c.long-id  broken across lines  -> fix: do this"
    assert lines[2] == "doctor: 1 ok, 0 info, 0 warn, 1 fail"


def test_json_lists_every_finding_and_the_verdict():
    findings = [Finding("a.b", "warn", "meh", "fix it"), Finding("c.d", "ok", "fine")]
    data = json.loads(doctor.render_json(findings))
    assert data == {"ok": True, "summary": {"ok": 1, "info": 0, "warn": 1, "fail": 0},
                    "findings": [{"id": "a.b", "status": "warn", "seen": "meh", "fix": "fix it"},
                                 {"id": "c.d", "status": "ok", "seen": "fine"}]}
    assert doctor.exit_code(findings + [Finding("e.f", FAIL, "x", "y")]) == 1


def test_a_check_that_breaks_is_a_finding_not_a_traceback(monkeypatch):
    def broken(ctx):
        raise KeyError("surprise")
        yield  # pragma: no cover

    monkeypatch.setattr(doctor, "GROUPS", (("driver", (broken,)),))
    findings = doctor.run(doctor.Options(config_path=None, env={}))
    assert findings == [Finding("driver.broken", FAIL, "the check itself failed: KeyError: 'surprise'",
                                "report this as an nvct bug")]
