"""The package layout the design card fixes, and the README's promise about CI."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["jetstream", "jetstream.rewrite", "jetstream.aggtree",
                                     "jetstream.approx", "jetstream.control",
                                     "jetstream.lab"])
def test_packages_exist_and_say_what_they_hold(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__doc__ and len(module.__doc__.strip()) > 20


def test_declared_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = " ".join(project["dependencies"])
    for name in ("pyspark", "grpcio", "protobuf", "networkx", "datasketches", "prometheus-client"):
        assert name in runtime
    dev = " ".join(project["optional-dependencies"]["dev"])
    for name in ("pytest", "hypothesis", "ruff", "mypy", "grpcio-tools"):
        assert name in dev
    assert project["scripts"]["jetstream"] == "jetstream.cli:main"


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./dev test" in readme
    assert "exec ./dev test" in ci


def test_nothing_of_the_product_reaches_into_the_lab() -> None:
    # The lab (demo, benchmarks, emulator, log generator) shows and measures the system; the
    # system itself must run without it. The CLI finds the lab's commands through an entry
    # point (jetstream.commands).
    package = ROOT / "jetstream"
    imports_lab = re.compile(r"^\s*(from jetstream\.lab\b|from jetstream import lab\b"
                             r"|import jetstream\.lab\b)", re.MULTILINE)
    users = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                   if imports_lab.search(path.read_text()) and path.parent != package / "lab")
    assert users == []
