"""course.compiled: registers and spills of a kernel compiled for an H100 (sm_90), read from
the cubin, with or without a GPU."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys

import course  # noqa: F401  (the execution mode before any kernel is defined)
from course import compiled, runtime

import pytest
import torch
import triton
import triton.language as tl

N_LONG = 32768
SCALE: tl.constexpr = tl.constexpr(2.0)
TABLE = {"not": "a number"}  # a global no kernel can use


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, stride_x_row, stride_y_row, n_cols, eps,
                   BLOCK_N: tl.constexpr):
    # Chapter 04's answer: the whole row in registers from its load to its store
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def scaled(v):
    return v * SCALE


@triton.jit
def scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(x_ptr + offsets, scaled(x), mask=offsets < n)


@triton.jit
def unwritten_kernel(x_ptr, BLOCK: tl.constexpr):
    raise NotImplementedError("write your solution here, in place of this line")


def long_row_args() -> tuple:
    row = torch.empty(1, N_LONG, dtype=torch.bfloat16)
    return (row, row[0], row, N_LONG, N_LONG, N_LONG, 1e-6)


@pytest.fixture(scope="module")
def long_rows() -> dict[int, compiled.Registers]:
    return compiled.registers_per_warps(rmsnorm_kernel, long_row_args(),
                                        dict(BLOCK_N=N_LONG), (4, 16))


def test_a_row_too_long_for_4_warps_spills(long_rows):
    # 256 values a thread, more than 255 registers can hold
    used = long_rows[4]
    assert used.n_regs == 255 and used.n_spills > 0, used
    assert used.spilled_bytes == 4 * used.n_spills
    assert (used.kernel, used.arch, used.num_warps) == ("rmsnorm_kernel", 90, 4)
    assert "words spilled" in str(used)


def test_512_threads_cap_a_thread_at_128_registers(long_rows):
    # 65536 registers an SM, shared by a program's 512 threads
    assert long_rows[16].n_regs <= 65536 // 512


def test_a_small_kernel_with_a_helper_and_a_global_constexpr_does_not_spill():
    used = compiled.registers(scale_kernel, (torch.empty(128), 100), dict(BLOCK=128))
    assert used.n_spills == 0 and 0 < used.n_regs < 32, used
    assert used.triton == triton.__version__


def test_counts_agree_with_ptxas_v(tmp_path):
    """The cubin's attributes against what ptxas -v printed when Triton ran it (a fresh
    cache, so ptxas runs; TRITON_DUMP_PTXAS_LOG prints its log)."""
    job = compiled.job_for(rmsnorm_kernel, long_row_args(), dict(BLOCK_N=N_LONG), (4, 8))
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DUMP_PTXAS_LOG="1", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, compiled.__file__, str(tmp_path / "job.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    *log, result = done.stdout.strip().splitlines()
    log = "\n".join(log)
    ptxas_registers = [int(n) for n in re.findall(r"Used (\d+) registers", log)]
    ptxas_frames = [int(n) for n in re.findall(r"(\d+) bytes stack frame", log)]
    read = [compiled.cubin_resources(base64.b64decode(m["cubin"]), m["name"])
            for m in json.loads(result)]
    assert ptxas_registers == [r for r, _ in read], log
    assert ptxas_frames == [f for _, f in read], log
    assert ptxas_frames[0] > 0 and ptxas_frames[1] < ptxas_frames[0]  # 4 warps spill more


@pytest.mark.parametrize("call, message", [
    (lambda: compiled.registers(long_row_args, (), {}), "needs a @triton.jit kernel"),
    (lambda: compiled.registers(rmsnorm_kernel, long_row_args()[:6], dict(BLOCK_N=N_LONG)),
     "takes 7 arguments besides its constexprs"),
    (lambda: compiled.registers(rmsnorm_kernel, long_row_args(), {}), "BLOCK_N"),
    (lambda: compiled.registers(rmsnorm_kernel, long_row_args(), dict(BLOCK_N=64, BLOCK=2)),
     "no tl.constexpr argument named BLOCK"),
    (lambda: compiled.registers(rmsnorm_kernel, long_row_args(), dict(BLOCK_N=64),
                                num_warps=3), "power of two"),
    (lambda: compiled.registers(rmsnorm_kernel, ([1.0],) + long_row_args()[1:],
                                dict(BLOCK_N=64)), "argument x_ptr"),
])
def test_bad_input_is_refused_before_compiling(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()


@triton.jit
def uses_a_dict(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), TABLE)


def test_a_kernel_using_a_global_it_cannot_carry_is_named():
    with pytest.raises(TypeError, match="uses the global 'TABLE'"):
        compiled.registers(uses_a_dict, (torch.empty(4),), dict(BLOCK=4))


def test_a_kernel_that_does_not_compile_gets_tritons_message():
    with pytest.raises(compiled.CompileError, match="(?s)unwritten_kernel.*Raise"):
        compiled.registers(unwritten_kernel, (torch.empty(4),), dict(BLOCK=4))


def test_a_triton_without_ptxas_or_nvidia_backend_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    assert "NVIDIA backend" in compiled.ptxas_problem(tmp_path)
    (tmp_path / "backends" / "nvidia" / "bin").mkdir(parents=True)
    assert "needs ptxas" in compiled.ptxas_problem(tmp_path)
    (tmp_path / "backends" / "nvidia" / "bin" / "ptxas").write_text("")
    assert compiled.ptxas_problem(tmp_path) is None
    assert compiled.ptxas_problem() is None  # this environment's Triton has one
    monkeypatch.setattr(compiled, "ptxas_problem", lambda: "registers needs ptxas (test)")
    with pytest.raises(RuntimeError, match="needs ptxas"):
        compiled.registers(scale_kernel, (torch.empty(4), 4), dict(BLOCK=4))


def test_the_kernel_module_rebuilds_its_helpers_and_globals():
    source = compiled.kernel_module_source(scale_kernel.fn)
    assert "SCALE = tl.constexpr(2.0)" in source
    assert source.index("def scaled(") < source.index("def scale_kernel(")
    assert source.count("@triton.jit") == 2


@pytest.mark.gpu
@pytest.mark.parametrize("warps", (4, 8, 16))
def test_counts_equal_the_gpus_own(warps):
    """On a GPU of compute capability 9.0, the launched kernel's n_regs and n_spills."""
    major, minor = torch.cuda.get_device_capability()
    x = torch.randn(4, N_LONG, dtype=torch.bfloat16, device=runtime.DEVICE)
    w = torch.rand(N_LONG, dtype=torch.bfloat16, device=runtime.DEVICE)
    y = torch.empty_like(x)
    launched = rmsnorm_kernel[(4,)](x, w, y, x.stride(0), y.stride(0), N_LONG, 1e-6,
                                    BLOCK_N=N_LONG, num_warps=warps)
    used = compiled.registers(rmsnorm_kernel, (x, w, y, x.stride(0), y.stride(0), N_LONG,
                                               1e-6), dict(BLOCK_N=N_LONG), warps,
                              arch=10 * major + minor)
    assert (used.n_regs, used.n_spills) == (launched.n_regs, launched.n_spills)

