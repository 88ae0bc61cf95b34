"""The checker as a learner meets it: kernels defined in notebook cells, run by a real
Jupyter kernel (nbclient), feedback rendered as output."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

SETUP = """import course
from course import check
import torch, triton
import triton.language as tl"""
KERNEL = '''
@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps,
                   BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)

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
    assert "15/15 cases pass" in shown and "interpreter mode" in shown
    assert "<table>" in nb.cells[2].outputs[-1]["data"]["text/html"]


@pytest.mark.slow
def test_a_dishonest_wrapper_in_a_cell_is_refused_with_the_cell_line():
    with pytest.raises(CellExecutionError) as failure:
        _run([SETUP, KERNEL, CHEAT, "check.rmsnorm_forward(rmsnorm_cheat, seed=1)"])
    text = str(failure.value)
    assert "computes with PyTorch" in text
    assert "at a notebook cell, line 3: return x * torch.rsqrt" in text
