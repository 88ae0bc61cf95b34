"""scripts/tune_kernels.py's candidate plans (the sweep itself needs a GPU)."""

import math
import sys
from dataclasses import replace
from pathlib import Path

import course  # noqa: F401  (mode first)

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import tune_kernels  # noqa: E402

from solutions.kernels.launch_plans import MAX_ROW_BLOCKS, Variant  # noqa: E402

SMS = 132


def test_a_backward_register_cap_is_what_lets_its_programs_share_an_sm():
    plans = [p for p in tune_kernels.backward_candidates(4096, 32768, SMS) if p.path == "split"]
    capped = [p for p in plans if p.max_registers]
    assert capped, "no capped candidate at 32768 columns"
    for p in capped:
        programs_per_sm = math.ceil(p.programs * p.split / SMS)
        threads_per_sm = programs_per_sm * 32 * p.num_warps
        assert threads_per_sm * p.max_registers <= tune_kernels.REGISTERS_PER_SM, p
        assert p.max_registers >= 64, p
    # every capped plan is also swept without its cap
    assert all(any(q == type(p)(**{**p.__dict__, "max_registers": 0}) for q in plans)
               for p in capped)


def test_split_candidates_cover_the_row():
    for n in (16384, 32768, 65536):
        for p in tune_kernels.backward_candidates(8192, n, SMS):
            assert p.block_n * p.split >= n, p


@pytest.mark.parametrize("n", [256, 4096, 16384])
def test_every_rows_plan_of_a_tile_a_program_is_offered_plain_streamed_and_weight_after(n):
    plans = tune_kernels.forward_candidates(n, SMS)
    one_tile = [p for p in plans if p.path == "rows" and not p.prefetch]
    plain = [p for p in one_tile if not p.stream and not p.weight_after]
    for variant in (Variant.STREAM, Variant.WEIGHT_AFTER):
        variants = [p for p in plans if p.variant is variant]
        assert variants and all(p.path == "rows" for p in variants)
        assert sorted(map(repr, variants)) == sorted(
            repr(replace(p, variant=variant)) for p in plain)


@pytest.mark.parametrize("n", [12288, 16384, 65536])
def test_every_loop_plan_of_a_program_per_row_is_offered_with_and_without_its_loops(n):
    plans = tune_kernels.forward_candidates(n, SMS)
    per_row = [p for p in plans if p.path == "loop" and not p.programs and p.block_n >= n]
    without_loops = [p for p in per_row if p.one_row]
    assert without_loops, f"no one_row candidate at {n} columns"
    assert sorted(map(repr, without_loops)) == sorted(
        repr(replace(p, variant=Variant.ONE_ROW)) for p in per_row if not p.one_row)
    # and rows in several unrolled blocks shorter than the row, never more than it unrolls
    in_blocks = [p for p in plans if p.one_row and p.block_n < n]
    assert in_blocks, f"no one_row candidate in blocks shorter than {n} columns"
    assert all(p.path == "loop" and not p.programs
               and p.row_blocks(n)["ROW_BLOCKS"] <= MAX_ROW_BLOCKS for p in in_blocks)


def test_the_compile_parts_run_every_plan_once_between_them(monkeypatch):
    import torch

    ran = []
    monkeypatch.setattr(tune_kernels, "runner", lambda op, t, plan: lambda: ran.append(plan))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    plans = tune_kernels.forward_candidates(1024, SMS)
    for k in range(4):
        tune_kernels.compile_plans("rmsnorm_fwd", 64, 1024, torch.float32, plans, f"{k}/4")
    assert sorted(map(repr, ran)) == sorted(map(repr, plans))
