"""Grade a made-up class with the instructor's tooling on this machine (GPU or not), and
print every verified point, what each speed cell printed, and the times.

    python scripts/grade_sample_class.py DIR --cheats [--honest 5]
        chapter 04: one honest submission (and more copies of it) beside the cheats of
        tests/grader_submissions.py (CH04_CHEATS)
    python scripts/grade_sample_class.py DIR --chapters ch04_fused,ch07_backward
        a correct submission of each chapter (and, with ch04, its slow two-pass kernel)
    python scripts/grade_sample_class.py DIR --students 6 --own-kernels [--gpus 0,1]
        a class: every chapter of each student answered, student 5's chapter 04 kernel
        two-pass and student 6's storing out of bounds; with --own-kernels each student's
        Triton kernels have their own source (a comment naming the student), so each
        student compiles their own, as in a real class. Prints the autograde time and a
        hash of grader/grades_by_exercise.csv, to compare runs on one GPU and on several

DIR receives a copy of the course (grader/ in it holds the gradebook, the verdicts and the
logs). Used for the GPU runs in docs/benchmarks.md; tests/test_grader_trust.py grades the
cheats in CI, in interpreter mode.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from grader_submissions import (  # noqa: E402  (tests/ is on the path above)
    CH04_BANDWIDTH,
    CH04_CHEATS,
    CH04_ILLEGAL_ADDRESS,
    CH04_TWO_PASS_SLOW,
    Submission,
    copy_course,
    release,
    solutions,
    write_inbox,
)

CHAPTERS = ("ch01_math", "ch02_roofline", "ch03_two_pass", "ch04_fused", "ch05_fused_add",
            "ch06_layernorm", "ch07_backward", "ch08_performance_lab")


# Where a Triton kernel's parameter list opens: Triton keys its cache on the kernel's
# source, so a comment there gives a student's kernel a compile of its own.
KERNEL_OPENING = re.compile(r"(@triton\.jit[^\n]*\n\s*def \w+\()")


def own_kernels(answers: dict[str, str], student: str) -> dict[str, str]:
    """`answers` with a comment naming `student` opening each Triton kernel's parameters."""
    return {grade_id: KERNEL_OPENING.sub(rf"\1  # {student}\n", code)
            for grade_id, code in answers.items()}


def class_of(students: int, chapters: tuple[str, ...], own: bool) -> list[Submission]:
    """Every chapter of `students` students answered; student 5's chapter 04 kernel reads
    x twice and student 6's stores out of bounds."""
    wrong = {5: CH04_TWO_PASS_SLOW, 6: CH04_ILLEGAL_ADDRESS}
    subs = []
    for k in range(1, students + 1):
        for chapter in chapters:
            answers = ({"ex04_fused_code": wrong[k]}
                       if chapter == "ch04_fused" and k in wrong else {})
            if own:
                answers = own_kernels({**solutions(ROOT, chapter), **answers}, f"student{k}")
            subs.append(Submission(f"student{k}", chapter, "answered", answers))
    return subs


def submissions(args: argparse.Namespace) -> tuple[tuple[str, ...], list[Submission]]:
    if args.students:
        chapters = tuple(args.chapters.split(",")) if args.chapters else CHAPTERS
        return chapters, class_of(args.students, chapters, args.own_kernels)
    if args.cheats:
        extra = [Submission(f"honest_{i}", "ch04_fused") for i in range(2, args.honest + 1)]
        return ("ch04_fused",), CH04_CHEATS + extra
    chapters = tuple(args.chapters.split(",")) if args.chapters else CHAPTERS
    subs = [Submission("correct", ch) for ch in chapters]
    if "ch04_fused" in chapters:
        subs.append(Submission("slow", "ch04_fused", "two passes",
                               {"ex04_fused_code": CH04_TWO_PASS_SLOW}, (CH04_BANDWIDTH,)))
    return chapters, subs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--cheats", action="store_true")
    parser.add_argument("--honest", type=int, default=1, help="with --cheats: honest copies")
    parser.add_argument("--chapters", default="", help="comma-separated (default: all)")
    parser.add_argument("--students", type=int, default=0, help="a class of this many")
    parser.add_argument("--own-kernels", action="store_true",
                        help="with --students: each student's kernels their own source")
    parser.add_argument("--gpus", default="", help="autograde's --gpus (default: one GPU)")
    parser.add_argument("--cell-timeout", type=int, default=400)
    args = parser.parse_args()
    chapters, subs = submissions(args)
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    root = copy_course(ROOT, args.dir / "course", chapters)
    release(root)
    write_inbox(root, args.dir / "inbox", subs)

    def instructor(*step: str) -> None:
        start = time.perf_counter()
        done = subprocess.run([sys.executable, str(root / "grader" / "instructor.py"), *step],
                              cwd=root, capture_output=True, text=True)
        print(f"$ instructor {' '.join(step)}: exit {done.returncode} in "
              f"{time.perf_counter() - start:.0f} s\n{done.stdout}{done.stderr}", flush=True)

    instructor("collect", str(args.dir / "inbox"))
    instructor("prepare")  # registers the chapters: not part of the time compared
    start = time.perf_counter()
    instructor("autograde", "--cell-timeout", str(args.cell_timeout),
               *(["--gpus", args.gpus] if args.gpus else []))
    took = time.perf_counter() - start
    instructor("grades")
    by_exercise = sorted((root / "grader" / "grades_by_exercise.csv").read_text().splitlines())
    print(f"autograde of {args.students or 'the'} student(s), GPUS={args.gpus or 'one'}: "
          f"{took:.1f} s; grades_by_exercise.csv sorted, sha256 "
          f"{hashlib.sha256(chr(10).join(by_exercise).encode()).hexdigest()}")
    for path in sorted((root / "grader" / "verified").glob("*/*.json")):
        verdict = json.loads(path.read_text())
        print(f"{path.parent.name}/{path.stem}: "
              f"{sum(c['points'] for c in verdict['cells']):g} / "
              f"{sum(c['max_points'] for c in verdict['cells']):g}, verified in "
              f"{verdict['seconds']:.0f} s")
        for cell in verdict["cells"]:
            reason = cell["reason"].splitlines()[0][:200] if cell["reason"] else ""
            print(f"  {cell['grade_id']}: {cell['points']:g}/{cell['max_points']:g} "
                  f"{cell['status']} {reason}")
            if cell["status"] == "passed" and cell["output"].strip() and any(
                    k in cell["grade_id"] for k in ("bandwidth", "compile")):
                print("    " + cell["output"].strip().replace("\n", "\n    "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
