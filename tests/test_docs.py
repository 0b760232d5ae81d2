"""Every shell command of ours in the README and the docs is one that works.

The commands are the lines of the ``sh`` blocks of ``README.md``, ``docs/*.md``,
``topologies/README.md`` and ``deploy/README.md``. How each is checked, since many start
clusters or run for minutes (a test of their own runs them: ``tests/test_distributed.py``,
``test_demo.py``, ``test_bench.py`` and the others):

- ``jetstream ...``: the CLI's own parser takes it (options as written; ``[--x N]`` in a usage
  line counts as given); the README's first commands, ``explain`` and ``local`` over the
  sample logs, run for real;
- ``python scripts/NAME.py ...``: the script exists and its ``--help`` names every option used;
- ``./dev COMMAND``: ``dev`` has the command.

Other programs (``sqlite3``, ``export``, ``for``) are not ours and are not run.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from jetstream.cli import main, parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "topologies" / "README.md", ROOT / "deploy" / "README.md"]


def commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every command of ours in the pages' ``sh`` blocks."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip()
                for part in re.split(r"&&|;|\bdo\b|\bdone\b", line):
                    words = part.replace("[", " ").replace("]", " ").rstrip("& ").split()
                    while words and (words[0] == "sudo" or "=" in words[0]):
                        words = words[1:]
                    if words and words[0] in ("jetstream", "python", "./dev"):
                        found.append((f"{page.relative_to(ROOT)}: {line}",
                                      shlex.split(" ".join(words))))
    return found


ALL = commands()


def test_the_pages_hold_commands() -> None:
    kinds = {argv[0] for _, argv in ALL}
    assert kinds == {"jetstream", "python", "./dev"}, kinds
    assert len(ALL) > 30


@pytest.mark.parametrize(("where", "argv"), [c for c in ALL if c[1][0] == "jetstream"],
                         ids=[w for w, a in ALL if a[0] == "jetstream"])
def test_a_jetstream_command_in_the_docs_is_one_the_cli_takes(where: str,
                                                              argv: list[str]) -> None:
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            parser().parse_args([a.replace("$s", "ams") for a in argv[1:]])
    except SystemExit:
        pytest.fail(f"{where}: {errors.getvalue().strip()}")


@pytest.mark.parametrize(("where", "argv"), [c for c in ALL if c[1][0] == "python"],
                         ids=[w for w, a in ALL if a[0] == "python"])
def test_a_script_in_the_docs_takes_the_options_given(where: str, argv: list[str]) -> None:
    script = ROOT / argv[1]
    assert script.is_file(), where
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                           text=True, timeout=120, cwd=ROOT)
    assert shown.returncode == 0, (where, shown.stderr[-2000:])
    for option in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
        assert option in shown.stdout, f"{where}: {option} not in its --help"


def test_the_dev_commands_in_the_docs_exist() -> None:
    dev = (ROOT / "dev").read_text()
    for where, argv in (c for c in ALL if c[1][0] == "./dev"):
        assert re.search(rf"^\s*{re.escape(argv[1])}\)", dev, re.M), where


def test_the_readmes_first_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["explain", "--query", "examples/cdn_topk.py"]) == 0
    out = tmp_path / "out.jsonl"
    assert main(["local", "--query", "examples/cdn_topk.py", "--input", "examples/logs",
                 "--output", str(out)]) == 0
    assert out.read_text().count("\n") > 3
    assert "1 rejected" in capsys.readouterr().err


def test_the_readme_is_a_front_door() -> None:
    # What it is, the two commands, a first query, what runs where, where to read on: the
    # reference is in docs/.
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    for page in re.findall(r"\]\((docs/[\w.-]+\.md)\)", "\n".join(lines)):
        assert (ROOT / page).is_file(), page
