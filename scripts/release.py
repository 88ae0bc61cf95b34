"""Regenerate the learners' notebooks (notebooks/) from the source notebooks (solutions/).

    python scripts/release.py              # what `make release` runs
    python scripts/release.py --into DIR   # write the release elsewhere (the tests compare)

Stock `nbgrader generate_assignment`, run from grader/ so that grader/nbgrader_config.py
applies, with `--no-db`: a release writes no gradebook (autograding keeps its own in
grader/). Every chapter folder `solutions/chNN_name/` holding `chNN_name.ipynb` is an
assignment; anything else in solutions/ (the reference kernels in solutions/kernels/) is
not. The release is built in a temporary folder first, so a failing chapter leaves
notebooks/ as it was; then each chapter's folder is replaced, and release folders whose
chapter no longer exists are removed. Other files in notebooks/ are left alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_NAME = re.compile(r"ch\d{2}_[a-z0-9_]+")
CHAPTER_GLOB = "ch[0-9][0-9]_*"  # nbgrader matches assignment ids with fnmatch


class ReleaseError(RuntimeError):
    """The sources cannot be released as they are; the message says why."""


def find_chapters(source_dir: Path) -> list[str]:
    """The chapter folders of `source_dir`, sorted; each must hold one notebook named like
    itself (solutions/ch01_math/ch01_math.ipynb)."""
    if not source_dir.is_dir():
        raise ReleaseError(f"no source folder at {source_dir}")
    chapters = []
    for folder in sorted(source_dir.glob(CHAPTER_GLOB)):
        if not folder.is_dir():
            continue
        if not CHAPTER_NAME.fullmatch(folder.name):
            raise ReleaseError(f"{folder}: a chapter folder is named chNN_words (lower case, "
                               "digits and underscores), for example ch01_math")
        notebooks = sorted(p.name for p in folder.glob("*.ipynb"))
        if notebooks != [f"{folder.name}.ipynb"]:
            raise ReleaseError(f"{folder}: a chapter holds exactly one notebook, named "
                               f"{folder.name}.ipynb; found {notebooks or 'none'}")
        chapters.append(folder.name)
    if not chapters:
        raise ReleaseError(f"no chapter folders (chNN_name) in {source_dir}")
    return chapters


# nbgrader imports jsonschema, whose optional IRI format checker (rfc3987_syntax, which
# Jupyter's "format-nongpl" extra installs) builds about 35 Earley parsers whenever it is
# imported: 1.5 to 2 s at every start of an nbgrader or verifier process, on a laptop
# (python-jsonschema issue 1428). No schema of nbformat, nbgrader or Jupyter checks an IRI
# format, so the grading's processes block that one import, and jsonschema leaves the two
# IRI formats unchecked, as it does wherever the package is not installed.
SKIP_IRI_PARSERS = "import sys; sys.modules.setdefault('rfc3987_syntax', None)"


def nbgrader_command() -> list[str]:
    """nbgrader from this Python's environment, whichever directory we run from (the
    `nbgrader` command's own entry point, with SKIP_IRI_PARSERS first)."""
    return [sys.executable, "-c", f"{SKIP_IRI_PARSERS}\n"
            "from nbgrader.apps.nbgraderapp import main\nsys.exit(main())"]


def generate(root: Path, release_dir: Path) -> list[str]:
    """Run nbgrader generate_assignment on every chapter of root/solutions, writing the
    release notebooks to `release_dir` (which must not exist yet). Returns the chapters."""
    chapters = find_chapters(root / "solutions")
    config = root / "grader" / "nbgrader_config.py"
    if not config.is_file():
        raise ReleaseError(f"no nbgrader configuration at {config}")
    env = dict(os.environ)
    # nbgrader starts `alembic` by name for database work: keep this environment's bin/ first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = nbgrader_command() + [
        "generate_assignment", CHAPTER_GLOB, "--no-db", "--force",
        f"--CourseDirectory.release_directory={release_dir}",
    ]
    done = subprocess.run(command, cwd=config.parent, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"nbgrader generate_assignment failed (exit status "
                           f"{done.returncode}):\n{done.stdout}{done.stderr}")
    missing = [ch for ch in chapters if not (release_dir / ch / f"{ch}.ipynb").is_file()]
    if missing:
        raise ReleaseError(f"nbgrader wrote no release notebook for {', '.join(missing)}:\n"
                           f"{done.stdout}{done.stderr}")
    return chapters


def release(root: Path = ROOT, into: Path | None = None) -> list[str]:
    """Regenerate `into` (default root/notebooks) from root/solutions; returns the chapters."""
    into = (root / "notebooks") if into is None else into
    with tempfile.TemporaryDirectory(prefix="release-") as scratch:
        built = Path(scratch) / "release"
        chapters = generate(root, built)
        into.mkdir(parents=True, exist_ok=True)
        for stale in into.glob(CHAPTER_GLOB):
            if stale.is_dir() and stale.name not in chapters:
                shutil.rmtree(stale)
        for chapter in chapters:
            target = into / chapter
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(built / chapter, target)
    return chapters


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--into", type=Path, default=None,
                        help="folder to write the release to (default: notebooks/)")
    args = parser.parse_args(argv)
    try:
        chapters = release(ROOT, args.into)
    except ReleaseError as error:
        print(f"release failed: {error}", file=sys.stderr)
        return 1
    where = args.into if args.into is not None else ROOT / "notebooks"
    print(f"released {len(chapters)} chapter(s) to {where}: {', '.join(chapters)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
