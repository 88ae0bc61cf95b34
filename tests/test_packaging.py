"""The two ways to build the environment agree, and the two commands build it first."""

from __future__ import annotations

import re
import sys
from pathlib import Path

# packaging (and tomli on Python 3.10) come with pytest itself.
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def requirement_map(lines: list[str]) -> dict[str, str]:
    """{normalised name: specifier} for requirement strings, e.g. 'Py_Yaml >= 6' -> pyyaml."""
    out: dict[str, str] = {}
    for line in lines:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        marker = f"; {req.marker}" if req.marker else ""
        out[name] = f"{extras}{req.specifier}{marker}"
    return out


def requirement_differences(conda: dict[str, str], pip: dict[str, str]) -> list[str]:
    """One line per package that is not required the same way by both files."""
    diffs = []
    for name in sorted(conda.keys() | pip.keys()):
        left, right = conda.get(name), pip.get(name)
        if left == right:
            continue
        left_s = "absent" if left is None else repr(left)
        right_s = "absent" if right is None else repr(right)
        diffs.append(f"{name}: environment.yml {left_s}, pyproject.toml {right_s}")
    return diffs


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def _conda_pip_section(env: dict) -> list[str]:
    sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, "environment.yml should have exactly one `pip:` section"
    return sections[0]


def _pyproject_requirements(project: dict) -> list[str]:
    return project["dependencies"] + project["optional-dependencies"]["dev"]


def test_environment_yml_and_pyproject_require_the_same_packages():
    conda = requirement_map(_conda_pip_section(_environment()))
    pip = requirement_map(_pyproject_requirements(_pyproject()["project"]))
    diffs = requirement_differences(conda, pip)
    assert not diffs, ("environment.yml's pip section and pyproject.toml (dependencies + dev) "
                       "disagree:\n  " + "\n  ".join(diffs))


def test_the_comparison_detects_a_changed_removed_or_added_requirement():
    pip_lines = _pyproject_requirements(_pyproject()["project"])
    changed = [re.sub(r"^numpy>=.*$", "numpy>=9.9", line) for line in pip_lines]
    changed = [line for line in changed if not line.startswith("tqdm")] + ["Extra_Pkg==1.0"]
    diffs = requirement_differences(requirement_map(changed), requirement_map(pip_lines))
    assert len(diffs) == 3, diffs
    assert "extra-pkg: environment.yml '==1.0', pyproject.toml absent" in diffs
    assert any(d.startswith("numpy: environment.yml '>=9.9'") for d in diffs)
    assert any(d.startswith("tqdm: environment.yml absent") for d in diffs)
    # names and spacing are normalised, so these are the same requirement
    assert requirement_map(["PyYAML >= 6.0"]) == requirement_map(["pyyaml>=6.0"])


def test_python_versions_agree():
    requires = _pyproject()["project"]["requires-python"]
    conda_python = [d for d in _environment()["dependencies"]
                    if isinstance(d, str) and re.match(r"python\b", d)]
    assert conda_python == [f"python{requires}"], (conda_python, requires)


def _makefile_prerequisites(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:(?!=)(.*)$", text, flags=re.MULTILINE)
    assert match, f"the Makefile has no `{target}` target"
    return match.group(1).split()


def test_make_lab_and_make_test_build_the_venv_first():
    text = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^STAMP\s*:?=\s*(.+)$", text, flags=re.MULTILINE)
    assert stamp and stamp.group(1).strip() == "$(VENV)/.installed"
    assert re.search(r"^\$\(STAMP\):", text, flags=re.MULTILINE), "no rule builds the stamp"
    for target in ("lab", "test"):
        assert "$(STAMP)" in _makefile_prerequisites(target), target


def test_ci_runs_make_test():
    script = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in script.splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert "make test" in commands
