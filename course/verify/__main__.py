"""python -m course.verify SOURCE --submission SUBMITTED VERDICT [--submission ...]
                           [--cell-timeout SECONDS] [--after-go]

Verifies each submitted notebook against its chapter's source notebook (course.verify's
text says how), one after the other, and writes each verdict as JSON as soon as it is
ready, atomically: a verdict file is either whole or absent. Prints the points of each
test cell. Exit status 0 when every verdict was written, 2 when the arguments are wrong.

With --after-go it starts (its imports, the first learner's process), then waits for the
line "go" on its standard input before it runs any submission, and verifies none if the
input ends first: the grader starts it while nbgrader runs the same chapter, so that the
start costs no time of its own (nothing is measured on the GPU while it waits).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# jsonschema (through nbformat) without its IRI parsers, which no notebook schema uses:
# 1.5 to 2 s less at every start of the verifier (scripts/release.py, SKIP_IRI_PARSERS).
sys.modules.setdefault("rfc3987_syntax", None)

from course.verify.protocol import die_with_parent  # noqa: E402
from course.verify.strays import adopt_strays  # noqa: E402
from course.verify.verifier import verify_all  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course.verify",
                                     description=__doc__.split("\n\n")[1].strip())
    parser.add_argument("source", type=Path, help="the chapter's source notebook")
    parser.add_argument("--submission", nargs=2, action="append", type=Path, required=True,
                        metavar=("SUBMITTED", "VERDICT"),
                        help="a submitted notebook and the file its verdict goes to")
    parser.add_argument("--cell-timeout", type=int, default=300, metavar="SECONDS")
    parser.add_argument("--after-go", action="store_true",
                        help='wait for the line "go" on standard input before verifying')
    args = parser.parse_args(argv)
    for path in [args.source] + [s for s, _ in args.submission]:
        if not path.is_file():
            parser.error(f"no file {path}")
    if args.cell_timeout <= 0:
        parser.error("--cell-timeout must be above 0")
    die_with_parent()  # it runs in a session of its own: a killed grader must not leave it
    adopt_strays()  # what a submission's code leaves running ends with its process
    verify_all([(s, v) for s, v in args.submission], args.source,
               cell_timeout_s=args.cell_timeout, say=lambda text: print(text, flush=True),
               ready=(lambda: sys.stdin.readline().strip() == "go") if args.after_go else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
