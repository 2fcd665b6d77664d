"""``nvct doctor``: check the whole chain on this node, one finding per line, change nothing.

::

    from nvct import doctor

    findings = doctor.run(doctor.Options(deep=False, docker_config="/etc/docker/daemon.json"))
    print(doctor.render_text(findings))
    exit(doctor.exit_code(findings))

Checks are small functions ``check(ctx) -> Iterable[Finding]`` grouped by
what they look at (one module each); :data:`GROUPS` lists them in the order
they run and print. A check that breaks is itself a ``fail`` finding, so one
bug never hides the others.
"""

from __future__ import annotations

import json

from nvct.doctor import cdi, cgroups, config, devices, driver, libraries, permissions, platforms, runtimes, standins
from nvct.doctor.model import FAIL, INFO, OK, STATUSES, WARN, Context, Finding, Options

__all__ = ["Finding", "Options", "Context", "GROUPS", "run", "render_text", "render_json", "exit_code",
           "OK", "INFO", "WARN", "FAIL"]

#: (group name, checks), in the order they run.
GROUPS = (
    ("config", config.CHECKS),
    ("platform", platforms.CHECKS),
    ("driver", driver.CHECKS),
    ("devices", devices.CHECKS),
    ("libraries", libraries.CHECKS),
    ("runtimes", runtimes.CHECKS),
    ("cdi", cdi.CHECKS),
    ("cgroup", cgroups.CHECKS),
    ("permissions", permissions.CHECKS),
    ("toolkit", standins.CHECKS),
)


def run(options: Options | None = None) -> list[Finding]:
    """Run every check against the node that ``options`` describe."""
    ctx = Context(options or Options())
    findings: list[Finding] = []
    for group, checks in GROUPS:
        skipped = platforms.not_applicable(ctx, group, checks)  # WSL2, Tegra: no NVIDIA kernel module
        if skipped is not None:
            findings.extend(skipped)
            continue
        for check in checks:
            try:
                findings.extend(check(ctx))
            except Exception as e:  # noqa: BLE001 - a broken check is a finding, not a traceback
                name = check.__name__.replace("check_", "").replace("_", "-")
                findings.append(Finding(f"{group}.{name}", FAIL, f"the check itself failed: "
                                        f"{type(e).__name__}: {e}", "report this as an nvct bug"))
    return findings


def exit_code(findings: list[Finding]) -> int:
    """1 when anything failed, else 0 (warnings do not fail the doctor)."""
    return 1 if any(f.status == FAIL for f in findings) else 0


def summary(findings: list[Finding]) -> dict[str, int]:
    return {status: sum(f.status == status for f in findings) for status in STATUSES}


def render_text(findings: list[Finding]) -> str:
    """One line per finding: status, id, what was seen, and the fix."""
    width = max((len(f.id) for f in findings), default=0)
    lines = []
    for f in findings:
        line = f"{f.status:<4}  {f.id:<{width}}  {_one_line(f.seen)}"
        if f.fix:
            line += f"  -> fix: {_one_line(f.fix)}"
        lines.append(line)
    counts = summary(findings)
    lines.append("doctor: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES))
    return "\n".join(lines) + "\n"


def render_json(findings: list[Finding]) -> str:
    return json.dumps({"ok": exit_code(findings) == 0, "summary": summary(findings),
                       "findings": [f.to_json() for f in findings]}, indent=2) + "\n"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
