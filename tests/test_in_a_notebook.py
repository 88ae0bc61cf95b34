"""The checker as a learner meets it: kernels defined in notebook cells, run by a real
Jupyter kernel (nbclient), feedback rendered as output."""

from __future__ import annotations

import inspect
import re

from course import runtime

import nbformat
import pytest
import rmsnorm_variants as variants
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

SETUP = """import course
from course import check
import torch, triton
import triton.language as tl"""
# The kernel cell holds the same source as the tests' correct kernel, typed into a cell.
KERNEL = inspect.getsource(variants.rmsnorm_kernel.fn) + '''

def rmsnorm(x, weight, eps=1e-6):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    rmsnorm_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), y.stride(0), x2.shape[1], eps,
                                   BLOCK_N=triton.next_power_of_2(x2.shape[1]))
    return y.view(x.shape)
'''
CHEAT = '''
def rmsnorm_cheat(x, weight, eps=1e-6):
    rmsnorm(x, weight, eps)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * weight
'''


def _run(cells: list[str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    return nb


def _text(cell) -> str:
    parts = []
    for out in cell.outputs:
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
        parts.extend(out.get("traceback", []))
    return "\n".join(parts)


@pytest.mark.slow
def test_a_correct_kernel_written_in_a_cell_passes_and_shows_its_report():
    nb = _run([SETUP, KERNEL, "check.rmsnorm_forward(rmsnorm, seed=1)"])
    shown = _text(nb.cells[2])
    # The notebook's kernel runs where this test runs: on a GPU the checker adds cases.
    passed = re.search(r"rmsnorm_forward: (\d+)/(\d+) cases pass \((\w+) mode", shown)
    assert passed, shown
    assert passed.group(1) == passed.group(2)
    assert passed.group(3) == ("gpu" if runtime.on_gpu() else "interpreter")
    # Shown once (issue #34): the printed table, then the value's one-line repr, no HTML copy.
    last = nb.cells[2].outputs[-1]["data"]
    assert last["text/plain"].startswith("<rmsnorm_forward report: "), last
    assert "text/html" not in last, last


@pytest.mark.slow
def test_a_dishonest_wrapper_in_a_cell_is_refused_with_the_cell_line():
    with pytest.raises(CellExecutionError) as failure:
        _run([SETUP, KERNEL, CHEAT, "check.rmsnorm_forward(rmsnorm_cheat, seed=1)"])
    text = str(failure.value)
    assert "computes with PyTorch" in text
    assert "at a notebook cell, line 3: return x * torch.rsqrt" in text
