"""Every reference kernel compiles to PTX for an H100 (sm_90) on a machine without a GPU,
and moves 16 bytes an access whenever its row length and strides allow it
(scripts/kernel_ptx.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel_ptx.py"


@pytest.fixture(scope="module")
def results() -> list[dict]:
    """One run of the script: a result per kernel launch and way."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def compiled(results) -> dict[tuple, dict[str, list[str]]]:
    """(kernel, constexprs) -> way -> global accesses."""
    cases: dict[tuple, dict[str, list[str]]] = defaultdict(dict)
    for r in results:
        cases[r["kernel"], json.dumps(r["constexprs"], sort_keys=True)][r["way"]] = r["accesses"]
    return cases


def test_every_kernel_compiles_for_sm90(compiled):
    names = {kernel for kernel, _ in compiled}
    assert len(names) == 17, sorted(names)  # forward and backward paths, and column sums


def test_a_stated_multiple_of_8_gives_the_accesses_of_rows_aligned_to_16(compiled):
    for case, ways in compiled.items():
        assert ways["stated"] == ways["aligned"], case
        assert any(".v4." in a for a in ways["stated"]), case


def test_without_the_statement_every_load_is_of_one_value(compiled):
    # rows of 4104 bf16 values two bytes a load, float32 partial sums four (launches with
    # EVEN, whose rows fill their blocks, are not compiled this way: kernel_ptx.WAYS)
    unstated = {case: ways for case, ways in compiled.items() if "unstated" in ways}
    assert len(compiled) - len(unstated) == 4, sorted(set(compiled) - set(unstated))
    for case, ways in unstated.items():
        loads = [a for a in ways["unstated"] if a.startswith("ld.")]
        assert loads and not any(".v2." in a or ".v4." in a for a in loads), case


def test_streamed_rows_load_evict_first_and_store_streaming(compiled):
    # ForwardPlan.stream: x and the residual evict-first, y and the new residual `.cs`
    # stores, and only the weight and bias asked to stay (evict_last); without it, plain
    # accesses. Both ops' rows kernels, each launched both ways.
    launched = set()
    for (kernel, constexprs), ways in compiled.items():
        if kernel not in ("rmsnorm_fwd_rows_kernel", "layernorm_fwd_rows_kernel"):
            continue
        launched.add((kernel, bool(json.loads(constexprs).get("STREAM"))))
        accesses = ways["aligned"]
        rows_loads = [a for a in accesses if a.startswith("ld.") and "evict_last" not in a]
        stores = [a for a in accesses if a.startswith("st.")]
        if json.loads(constexprs).get("STREAM"):
            assert rows_loads and all("evict_first" in a for a in rows_loads), accesses
            assert stores and all(".cs." in a for a in stores), accesses
        else:
            assert not any("evict_first" in a or ".cs." in a for a in accesses), accesses
    assert len(launched) == 4, launched


def test_launches_whose_rows_fill_their_blocks_load_without_masks(results):
    # EVEN (ForwardPlan.rows_even, ForwardPlan.row_blocks): not one predicated load, where
    # a run-time bound puts every load of the same kernels under a predicate
    forwards = [r for r in results if r["way"] == "aligned" and "_fwd_" in r["kernel"]]
    even = [r for r in forwards if r["constexprs"].get("EVEN")]
    assert {r["kernel"] for r in even} == {"rmsnorm_fwd_rows_kernel", "rmsnorm_fwd_loop_kernel",
                                           "layernorm_fwd_rows_kernel",
                                           "layernorm_fwd_loop_kernel"}
    for r in forwards:
        assert (r["predicated_loads"] == 0) == bool(r["constexprs"].get("EVEN")), r
