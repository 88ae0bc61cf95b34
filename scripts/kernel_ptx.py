"""Compile every reference kernel to PTX for a GPU that need not be here, and list how wide
its global loads and stores are.

    python scripts/kernel_ptx.py [--arch 90] [--json]

Each kernel is compiled three ways, for bfloat16 rows:
- `aligned`: row length and strides multiples of 16, as Triton notes by itself;
- `stated`: they are multiples of 8 only, and the launch says so (MULTIPLE=8,
  `row_loads.stated_multiple`), as it does for rows of 4104 columns;
- `unstated`: multiples of 8 only, and nothing said (MULTIPLE=1).

The first two should both move 16 bytes an access (`.v4.b32`); the third shows what the
statement buys (two bytes an access, `.b16`). It runs without a GPU (COURSE_DEVICE=compile
keeps the kernels out of Triton's interpreter) and fails where a kernel does not compile,
which the interpreter never shows: Triton 3.9 refused a kernel that 3.6 compiled.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from pathlib import Path

os.environ["COURSE_DEVICE"] = "compile"  # before course: kernels stay compilable
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import course  # noqa: E402,F401
from course import runtime  # noqa: E402

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

# The modules, not the functions of the same names that solutions.kernels exports
rms = importlib.import_module("solutions.kernels.rmsnorm")
ln = importlib.import_module("solutions.kernels.layernorm")
sums_module = importlib.import_module("solutions.kernels.column_sums")

# Pointers to float32 (statistics, partial sums) and to int64 (the split paths' slots);
# every other pointer is to the rows' dtype.
FLOAT32_POINTERS = {"rstd_ptr", "mean_ptr", "dw_partial_ptr", "partial_ptr"}
# One launch of each kernel, with constexprs as the launch rules give them.
CASES = [
    (rms.rmsnorm_fwd_rows_kernel, 4, dict(HAS_RESIDUAL=False, HAS_WEIGHT=True,
                                          STORE_RSTD=False, PREFETCH=False, BLOCK_M=4,
                                          BLOCK_N=4096)),
    (rms.rmsnorm_fwd_rows_kernel, 4, dict(HAS_RESIDUAL=True, HAS_WEIGHT=True, STORE_RSTD=True,
                                          PREFETCH=True, BLOCK_M=8, BLOCK_N=128)),
    (rms.rmsnorm_fwd_rows_kernel, 2, dict(HAS_RESIDUAL=True, HAS_WEIGHT=True, STORE_RSTD=False,
                                          PREFETCH=False, BLOCK_M=8, BLOCK_N=256,
                                          STREAM=True, WEIGHT_AFTER=True)),
    (rms.rmsnorm_fwd_rows_kernel, 8, dict(HAS_RESIDUAL=False, HAS_WEIGHT=True,
                                          STORE_RSTD=False, PREFETCH=False, BLOCK_M=4,
                                          BLOCK_N=512, WEIGHT_AFTER=True, EVEN=True)),
    (rms.rmsnorm_fwd_loop_kernel, 16, dict(HAS_RESIDUAL=False, HAS_WEIGHT=True,
                                           STORE_RSTD=True, BLOCK_N=8192, OUT_BLOCK=8192,
                                           ROW_BLOCKS=0, EVEN=False)),
    (rms.rmsnorm_fwd_loop_kernel, 32, dict(HAS_RESIDUAL=True, HAS_WEIGHT=True,
                                           STORE_RSTD=False, BLOCK_N=16384, OUT_BLOCK=8192,
                                           ROW_BLOCKS=1, EVEN=False)),
    (rms.rmsnorm_fwd_loop_kernel, 8, dict(HAS_RESIDUAL=True, HAS_WEIGHT=True,
                                          STORE_RSTD=True, BLOCK_N=2048, OUT_BLOCK=2048,
                                          ROW_BLOCKS=5, EVEN=True)),
    (rms.rmsnorm_fwd_split_kernel, 16, dict(HAS_RESIDUAL=False, HAS_WEIGHT=True,
                                            STORE_RSTD=False, RELOAD=True, SPLIT=4,
                                            BLOCK_N=16384, OUT_BLOCK=8192, EVEN=False)),
    (rms.rmsnorm_bwd_rows_kernel, 8, dict(HAS_WEIGHT=True, RELOAD=False, SUM_EACH_STEP=True,
                                          PREFETCH=True, BLOCK_M=2, BLOCK_N=4096)),
    (rms.rmsnorm_bwd_pieces_kernel, 4, dict(HAS_WEIGHT=True, HEAD=4096, TAIL=1024)),
    (rms.rmsnorm_bwd_loop_kernel, 8, dict(HAS_WEIGHT=True, BLOCK_N=4096)),
    (rms.rmsnorm_bwd_split_kernel, 8, dict(HAS_WEIGHT=True, SPLIT=4, BLOCK_N=8192)),
    (rms.rmsnorm_bwd_columns_kernel, 8, dict(HAS_WEIGHT=True, COLUMNS=128, BLOCK_M=8,
                                             BLOCK_N=1024)),
    (ln.layernorm_fwd_rows_kernel, 4, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=False,
                                           PREFETCH=False, BLOCK_M=4, BLOCK_N=4096)),
    (ln.layernorm_fwd_rows_kernel, 4, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=False,
                                           PREFETCH=False, BLOCK_M=4, BLOCK_N=1024,
                                           STREAM=True, WEIGHT_AFTER=True)),
    (ln.layernorm_fwd_rows_kernel, 2, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=True,
                                           PREFETCH=False, BLOCK_M=2, BLOCK_N=512,
                                           EVEN=True)),
    (ln.layernorm_fwd_loop_kernel, 16, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=True,
                                            BLOCK_N=8192, OUT_BLOCK=4096, ROW_BLOCKS=0,
                                            EVEN=False)),
    (ln.layernorm_fwd_loop_kernel, 16, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=False,
                                            BLOCK_N=16384, OUT_BLOCK=8192, ROW_BLOCKS=1,
                                            EVEN=False)),
    (ln.layernorm_fwd_loop_kernel, 8, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=True,
                                           BLOCK_N=2048, OUT_BLOCK=2048, ROW_BLOCKS=5,
                                           EVEN=True)),
    (ln.layernorm_fwd_loop_kernel, 8, dict(HAS_WEIGHT=True, HAS_BIAS=True, STORE_STATS=False,
                                           BLOCK_N=2048, OUT_BLOCK=2048, ROW_BLOCKS=6,
                                           EVEN=False)),
    (ln.layernorm_fwd_split_kernel, 16, dict(HAS_WEIGHT=True, HAS_BIAS=True,
                                             STORE_STATS=False, HEAD=ln.HEAD, RELOAD=True,
                                             SPLIT=4, BLOCK_N=16384, OUT_BLOCK=8192,
                                             EVEN=False)),
    (ln.layernorm_bwd_rows_kernel, 8, dict(HAS_WEIGHT=True, SUM_EACH_STEP=True, PREFETCH=True,
                                           BLOCK_M=2, BLOCK_N=4096)),
    (ln.layernorm_bwd_rows_kernel, 8, dict(HAS_WEIGHT=True, SUM_EACH_STEP=False,
                                           PREFETCH=False, BLOCK_M=2, BLOCK_N=1024)),
    (ln.layernorm_bwd_pieces_kernel, 4, dict(HAS_WEIGHT=True, HEAD=4096, TAIL=1024)),
    (ln.layernorm_bwd_loop_kernel, 8, dict(HAS_WEIGHT=True, BLOCK_N=4096)),
    (ln.layernorm_bwd_split_kernel, 8, dict(HAS_WEIGHT=True, SPLIT=4, BLOCK_N=8192)),
    (ln.layernorm_bwd_columns_kernel, 8, dict(HAS_WEIGHT=True, COLUMNS=128, BLOCK_M=8,
                                              BLOCK_N=1024)),
    (sums_module.column_sums_kernel, 4, dict(BLOCK_P=256, BLOCK_N=16)),
]
# (name, multiple stated, row length and strides multiples of 16). A launch with EVEN has
# checked that N is a multiple of its block, so it never takes the third way.
WAYS = (("aligned", 1, True), ("stated", 8, False), ("unstated", 1, False))


def signature(kernel, constexprs: dict, lengths_aligned: bool) -> tuple[dict, dict]:
    """Argument types for `ASTSource`, read from the argument names, and which arguments
    Triton would note as multiples of 16 (pointers always; lengths and strides if asked)."""
    types, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs or i in kernel.constexprs:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = ("*i64" if name == "slots_ptr" else
                           "*fp32" if name in FLOAT32_POINTERS else "*bf16")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "eps":
            types[name] = "fp32"
        elif name == "epoch":
            types[name] = "i64"
        else:
            types[name] = "i32"
            if lengths_aligned and (name == "N" or name.startswith("stride")):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return types, attrs


def global_accesses(ptx: str) -> list[str]:
    """The distinct global load and store instructions, e.g. `ld.global.v4.b32`."""
    return sorted(set(re.findall(r"(?:ld|st)\.global[.\w:]*", ptx)))


def predicated_loads(ptx: str) -> int:
    """How many global loads run under a predicate (`@%p1 ld.global...`): a mask's bound."""
    return len(re.findall(r"@!?%p\d+\s+ld\.global", ptx))


def compile_all(arch: int) -> list[dict]:
    results = []
    for kernel, warps, constexprs in CASES:
        for way, multiple, aligned in WAYS:
            if way == "unstated" and constexprs.get("EVEN"):
                continue
            consts = dict(constexprs, MULTIPLE=multiple)
            types, attrs = signature(kernel, consts, aligned)
            source = ASTSource(kernel, signature=types, constexprs=consts, attrs=attrs)
            compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                      options={"num_warps": warps})
            ptx = compiled.asm["ptx"]
            results.append({"kernel": kernel.fn.__name__, "constexprs": constexprs,
                            "way": way, "accesses": global_accesses(ptx),
                            "predicated_loads": predicated_loads(ptx)})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    assert runtime.MODE == "compile", runtime.MODE
    results = compile_all(args.arch)
    if args.json:
        print(json.dumps(results))
        return
    for r in results:
        print(f"{r['kernel']:28s} {r['way']:9s} {' '.join(r['accesses'])}")


if __name__ == "__main__":
    main()
