"""The Colab setup cell every chapter starts with, run against a simulated Colab: what it
installs, what it leaves alone (Colab's torch and triton), and the widget manager it turns
on. Then the package it installs, built from this checkout, and README's Colab links."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.name for p in (ROOT / "solutions").glob("ch[0-9][0-9]_*") if p.is_dir())
# Colab's own builds, which the cell must never ask pip to resolve or replace.
COLAB_OWNED = {"torch", "triton", "numpy", "matplotlib"}


def setup_cell(notebook: Path) -> str:
    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    return "".join(cells[0]["source"])


SETUP = setup_cell(ROOT / "solutions" / "ch00_setup" / "ch00_setup.ipynb")


def test_every_chapter_source_and_release_starts_with_the_same_setup_cell():
    for chapter in CHAPTERS:
        for folder in ("solutions", "notebooks"):
            got = setup_cell(ROOT / folder / chapter / f"{chapter}.ipynb")
            assert got == SETUP, f"{folder}/{chapter}: the first code cell is not the setup cell"


class SimulatedColab:
    """sys.modules['google.colab'] as Colab has it, recording what the cell does."""

    def __init__(self, monkeypatch, *, course_installed: bool):
        self.commands: list[list[str]] = []
        self.widget_manager_enabled = 0
        google = types.ModuleType("google")
        colab = types.ModuleType("google.colab")
        output = types.ModuleType("google.colab.output")
        output.enable_custom_widget_manager = self._enable
        colab.output = output
        google.colab = colab
        for name, module in (("google", google), ("google.colab", colab),
                             ("google.colab.output", output)):
            monkeypatch.setitem(sys.modules, name, module)
        real_find_spec = importlib.util.find_spec

        def find_spec(name, *args):
            if name == "course":
                return real_find_spec(name) if course_installed else None
            return real_find_spec(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        monkeypatch.setattr(subprocess, "run", self._run)

    def _enable(self):
        self.widget_manager_enabled += 1

    def _run(self, command, **kwargs):
        assert kwargs.get("check") is True, "a failed pip install must stop the cell"
        self.commands.append(list(command))
        return subprocess.CompletedProcess(command, 0)


def pip_requirements(command: list[str]) -> list[str]:
    assert command[:4] == [sys.executable, "-m", "pip", "install"], command
    return [a for a in command[4:] if not a.startswith("-")]


def test_on_a_fresh_colab_runtime_it_installs_the_course_without_touching_torch(monkeypatch):
    colab = SimulatedColab(monkeypatch, course_installed=False)
    namespace: dict = {}
    exec(SETUP, namespace)
    course_install, extras_install = colab.commands
    assert "--no-deps" in course_install
    assert pip_requirements(course_install) == [namespace["COURSE_REPOSITORY"]]
    names = {Requirement(r).name.lower() for r in pip_requirements(extras_install)}
    assert names == {"ipywidgets", "tqdm"} and not names & COLAB_OWNED
    assert colab.widget_manager_enabled == 1


def test_on_a_colab_runtime_that_has_the_course_it_installs_nothing(monkeypatch):
    colab = SimulatedColab(monkeypatch, course_installed=True)
    exec(SETUP, {})
    assert colab.commands == []
    assert colab.widget_manager_enabled == 1  # every session needs it, not only the first


def test_outside_colab_the_cell_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError(f"ran {args} outside Colab")

    monkeypatch.setattr(subprocess, "run", refuse)
    exec(SETUP, {})


def test_the_extras_agree_with_the_package_requirements():
    namespace: dict = {}
    exec(SETUP, namespace)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {Requirement(r).name.lower(): Requirement(r).specifier
                for r in project["dependencies"]}
    for extra in namespace["COLAB_EXTRAS"]:
        req = Requirement(extra)
        assert req.specifier == declared[req.name.lower()], extra


@pytest.mark.slow
def test_the_installed_package_holds_what_the_notebooks_import(tmp_path):
    """What `pip install --no-deps <repository>` puts on Colab, built from this checkout."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-build-isolation", "--target", str(tmp_path / "site"),
                           str(ROOT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    for part in ("course/__init__.py", "course/check/__init__.py", "course/widgets/__init__.py",
                 "solutions/kernels/rmsnorm.py", "solutions/kernels/layernorm.py"):
        assert (site / part).is_file(), part
    assert list((site / "course" / "data").glob("*.csv")), "the recorded benchmark run"
    assert not {p.name for p in site.iterdir()} & COLAB_OWNED


def test_readme_links_each_chapter_to_colab_from_the_setup_cells_repository():
    namespace: dict = {}
    exec(SETUP, namespace)
    owner_repo = re.match(r"git\+https://github\.com/(.+?)(\.git)?$",
                          namespace["COURSE_REPOSITORY"]).group(1)
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"https://colab\.research\.google\.com/github/([^)\s]+)", readme)
    expected = {f"{owner_repo}/blob/main/notebooks/{ch}/{ch}.ipynb" for ch in CHAPTERS}
    assert set(links) == expected
