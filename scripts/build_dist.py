"""Build the course's two distributions as wheels.

    python scripts/build_dist.py learner      # make dist: dist/norm_kernels-<v>-py3-none-any.whl
    python scripts/build_dist.py instructor   # make dist-instructor: dist/instructor/...whl
    python scripts/build_dist.py learner --into DIR

- **learner**: the package `course` with its data files, and nothing else: no reference
  kernels (solutions/kernels/), no source notebooks (their solutions and hidden tests). What
  a learner installs, on Colab from an uploaded wheel (the chapters' setup cell) or with
  `pip install --no-deps <wheel>` beside their own torch and triton. The checkers refuse a
  copy of a reference kernel from the fingerprints in course/data/, so the build first checks
  that those records are current (`scripts/reference_records.py`).
- **instructor**: `course` and `solutions.kernels`, what `pip install -e .` (`make lab`,
  `make test`) installs in a checkout, which the instructor tooling, the tests and the
  scripts use. The source notebooks stay in the repository, where nbgrader reads them.

Both are built from a copy of the files they hold (so nothing else of the checkout can slip
in, and the checkout gets no build/ or egg-info), with pip and the setuptools of this Python
(`--no-build-isolation`: no download).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
# pyproject.toml's package selection (the instructor's) and the learner's in its place
INSTRUCTOR_PACKAGES = 'include = ["course*", "solutions", "solutions.kernels*"]'
LEARNER_PACKAGES = 'include = ["course*"]'
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")


class BuildError(RuntimeError):
    """The distribution cannot be built as asked; the message says why."""


def _stage(into: Path, kind: str) -> None:
    """The files the distribution is built from, under `into`."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    if pyproject.count(INSTRUCTOR_PACKAGES) != 1:
        raise BuildError(f"pyproject.toml no longer selects its packages with "
                         f"`{INSTRUCTOR_PACKAGES}`: update scripts/build_dist.py with it")
    if kind == "learner":
        pyproject = pyproject.replace(INSTRUCTOR_PACKAGES, LEARNER_PACKAGES)
    (into / "pyproject.toml").write_text(pyproject)
    shutil.copy2(ROOT / "README.md", into / "README.md")
    shutil.copytree(ROOT / "course", into / "course", ignore=IGNORED)
    if kind == "instructor":
        (into / "solutions").mkdir()
        shutil.copy2(ROOT / "solutions" / "__init__.py", into / "solutions" / "__init__.py")
        shutil.copytree(ROOT / "solutions" / "kernels", into / "solutions" / "kernels",
                        ignore=IGNORED)


def wheel_problems(wheel: Path, kind: str) -> list[str]:
    """What the wheel holds that its kind must not, or lacks that it must."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        texts = {n: archive.read(n).decode(errors="replace") for n in names
                 if not n.endswith((".png", ".whl"))}
    problems = []
    data = {n.removeprefix("course/data/") for n in names if n.startswith("course/data/")}
    for needed in ("course/__init__.py", "course/check/__init__.py", "course/validation.py",
                   "course/kernel_records.py"):
        if needed not in names:
            problems.append(f"no {needed}")
    for needed in ("kernel_fingerprints.json", "reference_plans.json"):
        if needed not in data:
            problems.append(f"no course/data/{needed}")
    if not any(n.endswith(".csv") for n in data):
        problems.append("no recorded benchmark run (course/data/*.csv)")
    if kind == "learner":
        problems += [f"holds {n}" for n in names if n.startswith("solutions/")]
        problems += [f"holds a notebook, {n}" for n in names if n.endswith(".ipynb")]
        problems += [f"{n} holds nbgrader's {marker!r}" for n, text in texts.items()
                     for marker in ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION")
                     if marker in text]
    else:
        problems += [f"no {n}" for n in ("solutions/kernels/rmsnorm.py",
                                         "solutions/kernels/plans/h100.json",
                                         "solutions/kernels/kept_launch.c") if n not in names]
    return problems


def build(kind: str, into: Path | None = None) -> Path:
    """Build one distribution; returns the wheel's path."""
    if kind not in ("learner", "instructor"):
        raise BuildError(f"no distribution called {kind!r}: learner or instructor")
    if kind == "learner":
        check = subprocess.run([sys.executable, str(ROOT / "scripts" / "reference_records.py"),
                                "--check"], capture_output=True, text=True)
        if check.returncode != 0:
            raise BuildError("the learner's package would ship stale records of the reference "
                             f"kernels:\n{check.stdout}{check.stderr}")
    into = Path(into) if into is not None else DIST if kind == "learner" else DIST / kind
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"norm-kernels-{kind}-") as tmp:
        stage, out = Path(tmp) / "src", Path(tmp) / "out"
        stage.mkdir()
        _stage(stage, kind)
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                               "--no-build-isolation", "--wheel-dir", str(out), str(stage)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"pip wheel failed:\n{done.stdout}{done.stderr}")
        built = sorted(out.glob("*.whl"))
        if len(built) != 1:
            raise BuildError(f"expected one wheel, pip wrote {[p.name for p in built]}")
        problems = wheel_problems(built[0], kind)
        if problems:
            raise BuildError(f"the {kind} wheel is wrong: " + "; ".join(problems))
        target = into / built[0].name
        shutil.copy2(built[0], target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=("learner", "instructor"))
    parser.add_argument("--into", type=Path, help="folder for the wheel (default: dist/ for "
                        "the learner's, dist/instructor/ for the instructor's)")
    args = parser.parse_args(argv)
    try:
        wheel = build(args.kind, args.into)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    shown = wheel.relative_to(ROOT) if wheel.is_relative_to(ROOT) else wheel
    print(f"built the {args.kind} wheel: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
