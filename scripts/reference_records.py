"""Write what the learner's package records of the reference kernels (`course.kernel_records`)
from the kernels in solutions/kernels/.

    python scripts/reference_records.py           # write course/data/*.json
    python scripts/reference_records.py --check   # exit 1 if they are out of date

Run it after changing a kernel or a launch rule in solutions/kernels/ (a test fails until
it has been run): the learner's package ships these records instead of the kernels.

- course/data/kernel_fingerprints.json: the fingerprint of every @triton.jit function in
  solutions/kernels/*.py, read from the files (nothing is imported), so that the checkers
  can refuse a launch of a copy of one.
- course/data/reference_plans.json: the launch plans the reference kernels choose at the
  shapes the chapters show (PLANS below), planned for an H100 (132 SMs) whatever GPU is
  here, so that the record is the same wherever it is written.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from course import kernel_records  # noqa: E402  (course picks the mode before triton loads)

KERNELS = ROOT / "solutions" / "kernels"
# (op, M, N, element size) of each plan a chapter shows, forward then backward.
FORWARD_PLANS = (
    # chapter 04: a 16-bit input of 16384 rows, short rows to rows too long for registers
    *(("rmsnorm", 16384, n, 2) for n in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                                         262144)),
    # chapter 05: the fused add and the plain norm at a few rows of 4096
    ("add_rmsnorm", 8, 4096, 2), ("rmsnorm", 8, 4096, 2),
)
BACKWARD_PLANS = (
    ("rmsnorm", 262144, 384, 2),  # chapter 07: the split-size demonstration
)


def _is_kernel(node: ast.FunctionDef) -> bool:
    """Decorated with triton.jit (or jit, triton.autotune, triton.heuristics over it)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = ast.unparse(target)
        if name.split(".")[-1] in ("jit", "autotune", "heuristics"):
            return True
    return False


def fingerprints(kernels: Path = KERNELS) -> list[dict[str, str]]:
    """One entry per @triton.jit function of the reference kernels, sorted by name."""
    entries = []
    for path in sorted(kernels.glob("*.py")):
        text = path.read_text()
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and _is_kernel(node):
                source = ast.get_source_segment(text, node, padded=True)
                entries.append({"kernel": f"{module}.{node.name}",
                                "fingerprint": kernel_records.fingerprint(source)})
    return sorted(entries, key=lambda e: e["kernel"])


def plans() -> dict:
    import torch

    from solutions.kernels import launch

    gpu, h100 = torch.device("cuda"), launch.H100  # a plan for an H100; nothing is launched
    dtypes = {2: torch.bfloat16, 4: torch.float32}
    forward = [{"op": op, "M": m, "N": n, "element_size": size,
                "plan": dataclasses.asdict(launch.forward_plan(
                    m, n, gpu, element_size=size, residual=op == "add_rmsnorm",
                    layernorm=op == "layernorm", gpu=h100))}
               for op, m, n, size in FORWARD_PLANS]
    backward = [{"op": op, "M": m, "N": n, "element_size": size,
                 "plan": dataclasses.asdict(launch.backward_plan(
                     m, n, gpu, dtype=dtypes[size], layernorm=op == "layernorm", gpu=h100))}
                for op, m, n, size in BACKWARD_PLANS]
    return {"planned_for": f"an {h100.name} ({h100.sms} SMs)",
            "source": "solutions/kernels/launch.py (forward_plan, backward_plan)",
            "forward": forward, "backward": backward}


def records() -> dict[Path, str]:
    """The text of each record file, as this script writes it."""
    prints = {"scheme": kernel_records.SCHEME,
              "source": "solutions/kernels/*.py (scripts/reference_records.py)",
              "kernels": fingerprints()}
    return {kernel_records.FINGERPRINTS: json.dumps(prints, indent=1) + "\n",
            kernel_records.PLANS: json.dumps(plans(), indent=1) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a record is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in records().items():
        if path.is_file() and path.read_text() == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if args.check and stale:
        print("out of date (run python scripts/reference_records.py): " +
              ", ".join(str(p.relative_to(ROOT)) for p in stale))
        return 1
    if not stale:
        print("the records are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
