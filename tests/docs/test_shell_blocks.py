"""Every shell block of README.md and docs/*.md runs, or says why it cannot run here.

A block is a fenced ``sh``, ``bash``, ``shell`` or ``console`` block (of a
console block, the lines after a ``#`` or ``$`` prompt). It runs with
``bash -e`` from the repository root, as root, in a private mount namespace
where /etc, /srv, /run, /var, /usr/local, /opt and the checkout are
overlays on a tmpfs: what it writes there is gone when it ends, and the host
is untouched. nvct's system config (/etc/nvidia-container-runtime/config.toml)
points at a simulated GPU node, so nvct's commands run as on a GPU node.

A block that cannot run here has an HTML comment right before it (blank
lines between are allowed) with the reason::

    <!-- not-run: installs the package on the host (tests/packaging installs it in a throwaway root) -->

docs/testing.md describes the convention.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.support.fixtures import need_root

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELLS = ("sh", "bash", "shell", "console")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
#: What a block may change: each is an overlay on a tmpfs inside the block's mount namespace.
OVERLAID = ("/etc", "/srv", "/run", "/var", "/usr/local", "/opt", REPO)


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    lang: str
    text: str
    #: why it is not run here, or None
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{os.path.relpath(self.file, REPO)}:{self.line}"

    def script(self) -> str:
        if self.lang != "console":
            return self.text
        prompts = [line[2:] for line in self.text.splitlines() if line.startswith(("# ", "$ "))]
        return "\n".join(prompts) + "\n"


def blocks(paths=None) -> list[Block]:
    """The shell blocks of README.md and docs/*.md, in file order."""
    paths = paths or [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        i = 0
        while i < len(lines):
            match = _FENCE.match(lines[i])
            if not match:
                i += 1
                continue
            fence, lang, start = match.group(2), match.group(3), i
            i += 1
            body = []
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            i += 1
            if lang in SHELLS:
                out.append(Block(path, start + 1, lang, "\n".join(body) + "\n", _marker(lines, start)))
    return out


def _marker(lines: list[str], fence: int) -> str | None:
    """The not-run reason in the comment right before line ``fence`` (blank lines skipped)."""
    i = fence - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    match = NOT_RUN.match(lines[i].strip()) if i >= 0 else None
    return match.group(1) if match else None


ALL = blocks()


@pytest.fixture(scope="module")
def system_config(tmp_path_factory) -> str:
    """nvct's system config inside the blocks' namespace: a simulated node's."""
    need_root("builds a simulated node and runs blocks in a private mount namespace")
    from nvct.simulate import cached_node

    node = cached_node(tmp_path_factory.mktemp("docs-node"))
    with open(node["config"]) as f:
        return f.read()


def test_every_block_is_run_or_says_why_not(capsys):
    """The counts, with the reasons; a marker must give one."""
    skipped = [b for b in ALL if b.not_run is not None]
    assert ALL, "no shell block found"
    for block in skipped:
        assert block.not_run.strip(), f"{block.id}: not-run without a reason"
    with capsys.disabled():
        sys.stdout.write(f"\ndocs: {len(ALL)} shell blocks: {len(ALL) - len(skipped)} run, "
                         f"{len(skipped)} not run here:\n")
        for block in skipped:
            sys.stdout.write(f"  {block.id}: {block.not_run}\n")


def test_a_block_with_a_marker_is_not_run_and_others_are(tmp_path):
    """The parser: markers (with blank lines before the fence), console prompts, other languages."""
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- not-run: needs a GPU -->\n\n```sh\nfalse\n```\n\n```console\n# echo hi\nhi\n```\n"
                   "```python\nprint()\n```\n<!-- a comment -->\n```bash\ntrue\n```\n")
    found = blocks([str(doc)])
    assert [(b.line, b.lang, b.not_run) for b in found] == [(3, "sh", "needs a GPU"), (7, "console", None),
                                                            (15, "bash", None)]
    assert found[1].script() == "echo hi\n"


FILES = sorted({b.file for b in ALL if b.not_run is None})


@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_blocks_run(path, system_config, tmp_path):
    """A file's blocks in order, in one namespace: a block may use what an earlier one made."""
    runnable = [b for b in ALL if b.file == path and b.not_run is None]
    for block, (rc, output) in zip(runnable, run_blocks(runnable, system_config, tmp_path)):
        assert rc == 0, (f"{block.id} failed (exit {rc}); mark it '<!-- not-run: reason -->' if it cannot "
                         f"run here\n--- block:\n{block.script()}--- output:\n{output}")


def run_blocks(runnable: list[Block], system_config: str, tmp_path) -> list[tuple[int, str]]:
    """Each block under ``bash -e``, in order, in one private mount namespace (see the module's
    docstring); (exit status, output) of each."""
    work = str(tmp_path)
    for i, block in enumerate(runnable):
        with open(os.path.join(work, f"block-{i}.sh"), "w") as f:
            f.write(block.script())
    with open(os.path.join(work, "config.toml"), "w") as f:
        f.write(system_config)
    venv_bin = os.path.dirname(sys.executable)
    setup = [f'mount -t tmpfs nvct-docs "{work}/ovl"']
    for i, directory in enumerate(OVERLAID):
        setup.append(f'if [ -d "{directory}" ]; then mkdir -p "{work}/ovl/{i}/u" "{work}/ovl/{i}/w" && '
                     f'mount -t overlay overlay -o "lowerdir={directory},upperdir={work}/ovl/{i}/u,'
                     f'workdir={work}/ovl/{i}/w" "{directory}"; fi')
    setup += ["mkdir -p /etc/nvidia-container-runtime",
              f'cp "{work}/config.toml" /etc/nvidia-container-runtime/config.toml', f'cd "{REPO}"', "set +e"]
    for i in range(len(runnable)):
        setup.append(f'bash -e -o pipefail "{work}/block-{i}.sh" </dev/null >"{work}/out-{i}" 2>&1; '
                     f'echo $? >"{work}/rc-{i}"')
    os.makedirs(os.path.join(work, "ovl"))
    os.makedirs(os.path.join(work, "home"))
    env = {"PATH": f"{venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": os.path.join(work, "home"), "LANG": "C.UTF-8", "TMPDIR": work,
           "NVCT_STATE_DIR": os.path.join(work, "state")}
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-ec", "\n".join(setup)],
                          capture_output=True, text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)
    out = []
    for i in range(len(runnable)):
        try:
            with open(os.path.join(work, f"rc-{i}")) as f:
                rc = int(f.read())
            with open(os.path.join(work, f"out-{i}"), errors="replace") as f:
                output = f.read()
        except (OSError, ValueError):
            rc, output = -1, f"not run: the namespace's setup failed (exit {proc.returncode}): {proc.stderr}"
        out.append((rc, output))
    return out


def test_a_failing_block_fails_and_the_host_is_untouched(system_config, tmp_path):
    """The runner itself: exit statuses per block, state shared in order, writes kept from the host."""
    probe = f"nvct-docs-probe-{os.getpid()}"
    runnable = [Block("a.md", 1, "sh", f"mkdir -p /etc/{probe} /usr/local/{probe} /srv/{probe}\n", None),
                Block("a.md", 5, "sh", f"test -d /etc/{probe}\nfalse\necho not reached\n", None),
                Block("a.md", 9, "console", "# echo $HOME\n/root\n", None)]
    results = run_blocks(runnable, system_config, tmp_path)
    assert [rc for rc, _ in results] == [0, 1, 0]
    assert "not reached" not in results[1][1] and results[2][1].strip() == str(tmp_path / "home")
    for directory in ("/etc", "/usr/local", "/srv"):
        assert not os.path.exists(os.path.join(directory, probe))
