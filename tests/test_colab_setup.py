"""The Colab setup cell every chapter starts with, run against a simulated Colab: where it
installs the course from (the repository when it is published, else a learner wheel uploaded
to the runtime or kept on Drive, else a message saying what to do), what it leaves alone
(Colab's torch and triton), and the widget manager it turns on. Then the package it
installs, the learner wheel built from this checkout, and README's Colab links."""

from __future__ import annotations

import fnmatch
import glob
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
SETUP_NAMESPACE: dict = {}
exec(SETUP, SETUP_NAMESPACE)  # outside Colab it only defines its names


def test_every_chapter_source_and_release_starts_with_the_same_setup_cell():
    for chapter in CHAPTERS:
        for folder in ("solutions", "notebooks"):
            got = setup_cell(ROOT / folder / chapter / f"{chapter}.ipynb")
            assert got == SETUP, f"{folder}/{chapter}: the first code cell is not the setup cell"


UPLOADED = "/content/norm_kernels-0.1.0-py3-none-any.whl"
ON_DRIVE = "/content/drive/MyDrive/norm-kernels/norm_kernels-0.1.0-py3-none-any.whl"


class SimulatedColab:
    """sys.modules['google.colab'] as Colab has it, recording what the cell does: the pip
    commands it runs, whether it asks git about the repository (answered as `published`
    says), and the files it finds (`files`, the runtime's and the mounted Drive's)."""

    def __init__(self, monkeypatch, *, course_installed: bool, published: bool = False,
                 files: tuple[str, ...] = ()):
        self.pip: list[list[str]] = []
        self.git: list[list[str]] = []
        self.published = published
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
        monkeypatch.setattr(glob, "glob",
                            lambda pattern: [f for f in files if fnmatch.fnmatch(f, pattern)])

    def _enable(self):
        self.widget_manager_enabled += 1

    def _run(self, command, **kwargs):
        command = list(command)
        if "git" in command:
            assert command[:2] == ["env", "GIT_TERMINAL_PROMPT=0"], \
                "git must fail, not wait for a password nobody types"
            self.git.append(command)
            return subprocess.CompletedProcess(command, 0 if self.published else 128)
        assert kwargs.get("check") is True, "a failed pip install must stop the cell"
        self.pip.append(command)
        return subprocess.CompletedProcess(command, 0)


def pip_requirements(command: list[str]) -> list[str]:
    assert command[:4] == [sys.executable, "-m", "pip", "install"], command
    return [a for a in command[4:] if not a.startswith("-")]


def run_setup(colab: SimulatedColab, capsys, source: str = SETUP) -> tuple[dict, str]:
    namespace: dict = {}
    exec(source, namespace)
    return namespace, capsys.readouterr().out


def assert_installs(colab: SimulatedColab, what: str) -> None:
    course_install, extras_install = colab.pip
    assert "--no-deps" in course_install
    assert pip_requirements(course_install) == [what]
    names = {Requirement(r).name.lower() for r in pip_requirements(extras_install)}
    assert names == {"ipywidgets", "tqdm"} and not names & COLAB_OWNED
    assert colab.widget_manager_enabled == 1


def test_once_the_repository_is_published_it_installs_from_it(monkeypatch, capsys):
    colab = SimulatedColab(monkeypatch, course_installed=False, published=True,
                           files=(UPLOADED,))
    namespace, out = run_setup(colab, capsys)
    repository = namespace["COURSE_REPOSITORY"]
    assert colab.git and repository.removeprefix("git+") in colab.git[0]
    assert_installs(colab, repository)
    assert f"Installing the course from {repository}" in out


def test_before_it_is_published_it_installs_an_uploaded_wheel(monkeypatch, capsys):
    colab = SimulatedColab(monkeypatch, course_installed=False, files=(UPLOADED, ON_DRIVE))
    namespace, out = run_setup(colab, capsys)
    assert_installs(colab, UPLOADED)
    assert "is not published yet" in out and f"Installing the course from {UPLOADED}" in out


def test_or_a_wheel_kept_on_drive(monkeypatch, capsys):
    colab = SimulatedColab(monkeypatch, course_installed=False, files=(ON_DRIVE,))
    _, out = run_setup(colab, capsys)
    assert_installs(colab, ON_DRIVE)
    assert f"Installing the course from {ON_DRIVE}" in out


def test_with_no_repository_set_it_asks_git_nothing(monkeypatch, capsys):
    colab = SimulatedColab(monkeypatch, course_installed=False, published=True,
                           files=(UPLOADED,))
    unset = re.sub(r'^COURSE_REPOSITORY = ".*"$', 'COURSE_REPOSITORY = ""', SETUP, flags=re.M)
    assert unset != SETUP
    run_setup(colab, capsys, unset)
    assert colab.git == []
    assert_installs(colab, UPLOADED)


def test_with_neither_it_says_what_to_do_and_installs_nothing(monkeypatch, capsys):
    colab = SimulatedColab(monkeypatch, course_installed=False)
    with pytest.raises(FileNotFoundError) as missing:
        run_setup(colab, capsys)
    message = str(missing.value)
    for words in ("norm_kernels-<version>-py3-none-any.whl", "make dist", "/content",
                  "MyDrive/norm-kernels/", "Mount Drive", "run this cell again"):
        assert words in message, words
    assert colab.pip == [] and colab.widget_manager_enabled == 0


def test_on_a_colab_runtime_that_has_the_course_it_installs_nothing(monkeypatch, capsys):
    colab = SimulatedColab(monkeypatch, course_installed=True, files=(UPLOADED,))
    run_setup(colab, capsys)
    assert colab.pip == [] and colab.git == []
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
    """What the cell installs from a wheel: the learner wheel (`make dist`) built from this
    checkout, `pip install --no-deps` as the cell runs it. No reference kernels."""
    built = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_dist.py"), "learner",
                            "--into", str(tmp_path / "dist")], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("norm_kernels-*.whl")
    assert fnmatch.fnmatch(f"/content/{wheel.name}", SETUP_NAMESPACE["COURSE_WHEELS"][0])
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--no-index", "--target", str(tmp_path / "site"), str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    for part in ("course/__init__.py", "course/check/__init__.py", "course/widgets/__init__.py",
                 "course/validation.py", "course/data/kernel_fingerprints.json"):
        assert (site / part).is_file(), part
    assert list((site / "course" / "data").glob("*.csv")), "the recorded benchmark run"
    assert not (site / "solutions").exists(), "the reference kernels are not for learners"
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
