"""Chapter 04 asks for one read of x. Chapter 03's two-pass kernel, one launch and right,
reads each row twice; on an H200 its second read came from L2 fast enough to pass the
bandwidth target, so the bandwidth check counts loads (course.verify.load_count): the
traced call's kernels rebuilt from source with a counter on every load, and replayed.

Here the kernels are the two chapters' own answers, as the source notebooks hold them. In
a learner's process without a GPU the check counts them in Triton's interpreter; in grading
the verifier counts them itself, on a GPU, on the trace of the call it times (the test of
that path runs it in the interpreter, with these answers as the learner's).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import course  # noqa: F401  (the execution mode is chosen before any kernel is defined)
from course import bench, check, hardware, runtime
from course.check.bandwidth import timed_bandwidth_check
from course.check.rmsnorm import forward_call_spec
from course.hardware import NeedsGPU
from course.verify.load_count import CannotCount, counting_kernels, load_counts
from course.verify.replay import kernel_source, trace_call

import pytest
import torch
import triton
import triton.language as tl
from grader_submissions import ROOT, solutions

TWICE = "reads each row of `x` twice"

# What the chapters' earlier cells define for their exercise cells.
PREAMBLE = '''\
import torch
import triton
import triton.language as tl

from course import validation


def warps_for(block_n: int) -> int:
    return min(32, max(4, block_n // (32 * 16)))

'''
# Chapter 03's exercise cell (rmsnorm_two_pass) and chapter 04's (rmsnorm).
ANSWERS = (PREAMBLE + solutions(ROOT, "ch03_two_pass")["ex03_two_pass_code"] + "\n\n"
           + solutions(ROOT, "ch04_fused")["ex04_fused_code"])


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """The two answers as a module of their own (Triton reads a kernel's source file)."""
    return _imported(tmp_path_factory, "chapter_answers", ANSWERS)


def _imported(tmp_path_factory, name: str, source: str):
    """`source` written to a file (Triton reads a kernel's source file) and imported as the
    module `name`; its path is the module's `path`."""
    path = tmp_path_factory.mktemp(name) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.path = path
    return module


def _counts(fn, x: torch.Tensor) -> torch.Tensor:
    args = (x, torch.rand(x.shape[-1], device=x.device) + 0.5)
    return load_counts(trace_call(fn, args)[1], args, 0)


def test_chapter_03s_answer_loads_every_element_of_x_twice_and_chapter_04s_once(answers):
    # 2500 columns: three of chapter 03's blocks of 1024, the last one masked; and rows that
    # are slices of longer ones (row stride 3000), whose gaps no kernel may load
    x = torch.randn(3, 3000, device=runtime.DEVICE)[:, :2500]
    assert torch.equal(_counts(answers.rmsnorm_two_pass, x),
                       torch.full(x.shape, 2, dtype=torch.int32))
    assert torch.equal(_counts(answers.rmsnorm, x), torch.ones(x.shape, dtype=torch.int32))


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_the_bandwidth_check_refuses_chapter_03s_answer_and_says_why(answers,
                                                                                     capsys):
    with pytest.raises(AssertionError) as refused:
        check.rmsnorm_forward_bandwidth(answers.rmsnorm_two_pass)
    message = str(refused.value)
    assert TWICE in message and "every element of `x` was loaded twice" in message
    assert "Chapter 04 asks for one read of x" in message
    assert "chapter 03's two-pass kernel reads each row once" in message
    # The honest answer gets the usual word: no bandwidth without a GPU.
    assert check.rmsnorm_forward_bandwidth(answers.rmsnorm) is None
    assert "needs a GPU" in capsys.readouterr().out
    with pytest.raises(NeedsGPU):
        check.rmsnorm_forward_bandwidth(answers.rmsnorm, on_cpu="fail")


def _through_y(source: str) -> str:
    """Chapter 04's answer made to store x into y, load it back from there, and normalise
    what it loaded (y then overwritten with the answer): y used as scratch."""
    line = "    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)\n"
    assert source.count(line) == 1 and source.count("rmsnorm_kernel") == 2
    return source.replace("rmsnorm_kernel", "rmsnorm_through_y_kernel").replace(
        "def rmsnorm(", "def rmsnorm_through_y(").replace(line, (
            "    tl.store(y_ptr + row * stride_y_row + cols, x.to(y_ptr.dtype.element_ty),"
            " mask=mask)\n"
            "    x = tl.load(y_ptr + row * stride_y_row + cols, mask=mask, other=0.0)"
            ".to(tl.float32)\n" + line))


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_chapter_04_refuses_a_row_stored_into_y_and_loaded_back(
        tmp_path_factory):
    """x read once, one launch, y right: chapter 04 counted the loads of x only, so a kernel
    that kept the row in y rather than in registers passed."""
    source = PREAMBLE + _through_y(solutions(ROOT, "ch04_fused")["ex04_fused_code"])
    module = _imported(tmp_path_factory, "chapter_04_through_y", source)
    with pytest.raises(AssertionError) as refused:
        check.rmsnorm_forward_bandwidth(module.rmsnorm_through_y)
    message = str(refused.value)
    assert ("your kernel stores values into the memory of `y`, which your function returns "
            "(passed to your kernel as `y_ptr`) and loads them back: every element of that "
            "buffer was loaded once") in message, message
    assert "Chapter 04 keeps the row in registers" in message


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_chapter_06_refuses_centred_values_stored_into_y_and_loaded_back(
        tmp_path_factory):
    """Chapter 06's answer made to store the centred row into y and load it back for the
    variance: x read once, y right, so only the count of y's loads refuses it."""
    answers = solutions(ROOT, "ch06_layernorm")
    line = "    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)\n"
    kernel = answers["ex06_layernorm_kernel_code"]
    assert kernel.count(line) == 1
    kernel = kernel.replace(line, (
        "    tl.store(y_ptr + row * stride_y_row + cols, centred, mask=mask)\n"
        "    centred = tl.load(y_ptr + row * stride_y_row + cols, mask=mask, other=0.0)"
        ".to(tl.float32)\n" + line))
    module = _imported(tmp_path_factory, "chapter_06_through_y",
                       PREAMBLE + kernel + "\n\n" + answers["ex06_layernorm_wrapper_code"])
    with pytest.raises(AssertionError) as refused:
        check.layernorm_forward_bandwidth(module.layernorm)
    message = str(refused.value)
    assert ("your kernel stores values into the memory of `y`, which your function returns "
            "(passed to your kernel as `y_ptr`) and loads them back") in message, message
    assert "Chapter 06 keeps the row in registers" in message, message


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_a_wrong_kernel_is_left_to_the_correctness_checks(capsys):
    import rmsnorm_variants

    # Every program reads row 0: loaded once per row, but the bug is the row offset, which
    # the correctness checks name; the bandwidth check says only that it needs a GPU.
    assert check.rmsnorm_forward_bandwidth(rmsnorm_variants.wrong_row_offset) is None
    assert "needs a GPU" in capsys.readouterr().out


@triton.jit
def _look_again(x_ptr, cols, mask):
    return tl.atomic_add(x_ptr + cols, 0.0, mask=mask)  # adds nothing, returns what it read


@triton.jit
def _rereads_kernel(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(pointer=x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    first = tl.load(x_ptr + row * n_cols)  # one element again, a scalar load with no mask
    again = _look_again(x_ptr + row * n_cols, cols, mask & (cols < 4))
    tl.store(y_ptr + row * n_cols + cols, x + first + again * 0.0, mask=mask)


def rereads(x, weight, eps=1e-6):
    y = torch.empty_like(x)
    _rereads_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y


def test_loads_by_keyword_scalar_loads_and_atomics_in_a_helper_are_all_counted():
    counts = _counts(rereads, torch.randn(3, 10, device=runtime.DEVICE))
    want = torch.ones(3, 10, dtype=torch.int32)
    want[:, 0] += 1       # the scalar load
    want[:, :4] += 1      # the atomic, in the helper kernel
    assert torch.equal(counts, want)


def test_a_kernel_that_reads_part_of_x_again_is_told_how_much_and_where():
    from course.check.bandwidth import second_reads

    counts = _counts(rereads, torch.randn(3, 10, device=runtime.DEVICE))
    assert second_reads(counts, "x") == (
        "your kernel reads part of `x` more than once: 12 of its 30 elements were loaded up "
        "to 3 times, in 3 of its rows (the first: row 0)")
    assert second_reads(torch.ones(3, 10), "x") is None


@triton.jit
def _block_pointer_kernel(x_ptr, n):
    tl.load(tl.make_block_ptr(x_ptr, (n,), (1,), (0,), (16,), (0,)))


@triton.jit
def _named_load_kernel(x_ptr):
    load = tl.load
    load(x_ptr)


@triton.jit
def _getattr_kernel(x_ptr):
    getattr(tl, "lo" + "ad")(x_ptr)


@triton.jit
def _module_dict_kernel(x_ptr):
    tl.__dict__["load"](x_ptr)


@pytest.mark.parametrize("kernel, how", [(_block_pointer_kernel, "a block pointer"),
                                         (_named_load_kernel, "`tl.load` used other than"),
                                         (_getattr_kernel, "introspection"),
                                         (_module_dict_kernel, r"introspection \(`tl.__dict__`")])
def test_reads_the_counter_cannot_follow_are_refused_saying_which(kernel, how):
    bundles: dict[str, dict] = {}
    kernel_source(kernel, bundles)
    with pytest.raises(CannotCount, match=how):
        counting_kernels(bundles, torch.zeros(1, dtype=torch.int32), 0, 1)


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    """A learner's process, as the autograder starts it, that ran both answers."""
    from test_verify import started_learner

    found = started_learner(tmp_path_factory.mktemp("learner"), ANSWERS)
    yield found
    found.process.close()


@pytest.fixture
def fake_timer(monkeypatch):
    """bench.measure runs the real rotation of calls and reports 90 % of a pretend copy
    bandwidth: there is no GPU clock here."""
    def measure(label, fn, make_args, nbytes, *, reps=100, warmup=10, hide_launch=False):
        bench.time_rotating(fn, make_args, nbytes, warmup=2, reps=reps)
        return bench.Measurement(label, nbytes / (0.9 * 2e12), nbytes, 2e12)

    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(hardware, "copy_bandwidth", lambda nbytes=None: 2e12)


def test_the_verifier_counts_the_loads_of_the_call_it_times(learner, fake_timer, monkeypatch):
    """The count runs in the verifier, on the trace of the watched call whose replay it
    times: the learner's process is asked nothing more than without it."""
    asked = []
    request = learner.process.request
    monkeypatch.setattr(learner.process, "request", lambda message: asked.append(
        (message.get("op"), bool(message.get("trace")))) or request(message))

    def make_args():
        return (torch.randn(16, 2500, device=runtime.DEVICE),
                torch.rand(2500, device=runtime.DEVICE) + 0.5)

    def speed_check(name):
        asked.clear()
        return timed_bandwidth_check("rmsnorm 16x2500", learner.function(name), make_args,
                                     10**6, forward_call_spec(torch.float32), target=0.75,
                                     reps=4)

    with pytest.raises(AssertionError, match=f"rmsnorm 16x2500: your kernel {TWICE}"):
        speed_check("rmsnorm_two_pass")
    # the watched call, traced, and the same tensors refilled; refused before timing
    assert asked == [("call", True), ("call", False)]
    assert speed_check("rmsnorm").passed
    assert asked == [("call", True), ("call", False), ("call", False)]


# Compiles both answers' counting kernels for an H100 (sm_90) without a GPU: what the
# verifier compiles on one. COURSE_DEVICE=compile keeps kernels out of the interpreter.
COMPILE = '''
import importlib.util, os, re, sys
os.environ["COURSE_DEVICE"] = "compile"
import course, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from course.verify.load_count import counting_kernels
from course.verify.replay import kernel_source

spec = importlib.util.spec_from_file_location("chapter_answers", sys.argv[1])
answers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(answers)
types = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "stride_x_row": "i64",
         "stride_y_row": "i64", "n_cols": "i32", "eps": "fp32", "BLOCK_N": "constexpr"}
for kernel in (answers.rmsnorm_two_pass_kernel, answers.rmsnorm_kernel):
    bundles = {}
    name = kernel_source(kernel, bundles)
    counted = counting_kernels(bundles, torch.zeros(1, dtype=torch.int32), 1 << 40, 1 << 30)
    source = ASTSource(counted[name], signature=types, constexprs={"BLOCK_N": 1024})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    print(kernel.fn.__name__, len(re.findall(r"(?:red|atom)[.]global[.][.\\w]*add", ptx)))
'''


def test_the_counting_kernels_compile_for_a_gpu(answers):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE, str(answers.path)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    counters = dict(line.split() for line in done.stdout.splitlines())
    # the counter's atomic adds (neither answer has atomics of its own)
    assert int(counters["rmsnorm_two_pass_kernel"]) > 0 and int(counters["rmsnorm_kernel"]) > 0


@pytest.mark.gpu
def test_gpu_bandwidth_check_refuses_chapter_03s_answer_at_the_timing_shape(answers):
    with pytest.raises(AssertionError, match=TWICE):
        check.rmsnorm_forward_bandwidth(answers.rmsnorm_two_pass)
    assert check.rmsnorm_forward_bandwidth(answers.rmsnorm).passed



# ----------------------------------------------- chapters 05 and 06 ask for one read of x too

@triton.jit
def _add_rmsnorm_reads_twice_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_cols, eps,
                                    BLOCK_N: tl.constexpr):
    # Right, but x and the residual are loaded again for y instead of kept.
    at = tl.program_id(0) * n_cols + tl.arange(0, BLOCK_N)
    mask = tl.arange(0, BLOCK_N) < n_cols
    h = (tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
         + tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + at, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    again = (tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
             + tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32))
    again = again.to(h_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + tl.arange(0, BLOCK_N), mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + at, (again * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm_reads_twice(x, residual, weight, eps=1e-6):
    y, h = torch.empty_like(x), torch.empty_like(x)
    _add_rmsnorm_reads_twice_kernel[(x.shape[0],)](x, residual, weight, y, h, x.shape[1], eps,
                                                   BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y, h


@triton.jit
def _add_rmsnorm_rereads_residual_kernel(x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, n_cols, eps,
                                         BLOCK_N: tl.constexpr):
    # Right, and x is kept: only the residual is loaded again, to add it anew for y.
    at = tl.program_id(0) * n_cols + tl.arange(0, BLOCK_N)
    mask = tl.arange(0, BLOCK_N) < n_cols
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    h = (x + tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + at, h, mask=mask)
    h = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / n_cols + eps)
    again = x + tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32)
    again = again.to(h_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + tl.arange(0, BLOCK_N), mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + at, (again * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm_rereads_residual(x, residual, weight, eps=1e-6):
    y, h = torch.empty_like(x), torch.empty_like(x)
    _add_rmsnorm_rereads_residual_kernel[(x.shape[0],)](
        x, residual, weight, y, h, x.shape[1], eps, BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y, h


@triton.jit
def _layernorm_reads_twice_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_cols, eps,
                                  BLOCK_N: tl.constexpr):
    # Right, but x is loaded again for y instead of kept.
    cols = tl.arange(0, BLOCK_N)
    at = tl.program_id(0) * n_cols + cols
    mask = cols < n_cols
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centred = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
    x = tl.load(x_ptr + at, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + at, ((x - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)


def layernorm_reads_twice(x, weight, bias, eps=1e-5):
    y = torch.empty_like(x)
    _layernorm_reads_twice_kernel[(x.shape[0],)](x, weight, bias, y, x.shape[1], eps,
                                                 BLOCK_N=triton.next_power_of_2(x.shape[1]))
    return y


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
@pytest.mark.parametrize("chapter", ["05", "06"])
def test_without_a_gpu_chapters_05_and_06_refuse_a_second_read_of_x(chapter, capsys):
    import add_rmsnorm_variants
    import layernorm_variants

    checker, twice, honest = {
        "05": (check.add_rmsnorm_bandwidth, add_rmsnorm_reads_twice, add_rmsnorm_variants.correct),
        "06": (check.layernorm_forward_bandwidth, layernorm_reads_twice,
               layernorm_variants.correct),
    }[chapter]
    with pytest.raises(AssertionError) as refused:
        checker(twice)
    assert TWICE in str(refused.value)
    assert f"Chapter {chapter} asks for one read of x" in str(refused.value)
    assert checker(honest) is None
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_chapter_05_refuses_a_second_read_of_the_residual_alone():
    # Only x was counted, on the belief that a kernel reading the residual again reads x
    # again too: this one keeps x and passed.
    with pytest.raises(AssertionError) as refused:
        check.add_rmsnorm_bandwidth(add_rmsnorm_rereads_residual)
    assert "your kernel reads each row of `residual` twice" in str(refused.value)
    assert "Chapter 05 asks for one read of x and of the residual" in str(refused.value)


# ------------------------------- chapter 05: the sum stored, then loaded back from the output

def _read_back(source: str) -> str:
    """Chapter 05's answer made to load the sum back from residual_out after storing it,
    instead of converting the rounded value it holds."""
    for old, new in (("add_rmsnorm_kernel", "add_rmsnorm_read_back_kernel"),
                     ("def add_rmsnorm(", "def add_rmsnorm_read_back("),
                     ("    h = h.to(tl.float32)\n",
                      "    h = tl.load(residual_out_ptr + row * stride_residual_out_row + cols,"
                      " mask=mask, other=0.0).to(tl.float32)\n")):
        assert source.count(old) >= 1, old
        source = source.replace(old, new)
    return source


def _scratch(source: str) -> str:
    """Chapter 05's answer made to store the sum a second time, into a buffer the wrapper
    allocates and does not return, and to load it back from there for the norm: neither an
    input nor an output."""
    load = "tl.load(scratch_ptr + row * stride_residual_out_row + cols, mask=mask, other=0.0)"
    for old, new in (("add_rmsnorm_kernel", "add_rmsnorm_scratch_kernel"),
                     ("def add_rmsnorm(", "def add_rmsnorm_scratch("),
                     ("n_cols, eps, BLOCK_N: tl.constexpr", "n_cols, eps, scratch_ptr, "
                      "BLOCK_N: tl.constexpr"),
                     ("N, eps, BLOCK_N=BLOCK_N,", "N, eps, torch.empty_like(y), BLOCK_N=BLOCK_N,"),
                     ("    h = h.to(tl.float32)\n",
                      "    tl.store(scratch_ptr + row * stride_residual_out_row + cols, h,"
                      " mask=mask)\n"
                      f"    h = {load}.to(tl.float32)\n")):
        assert source.count(old) == (2 if old == "add_rmsnorm_kernel" else 1), old
        source = source.replace(old, new)
    return source


CH05 = solutions(ROOT, "ch05_fused_add")
CH05_ANSWER = ("import torch\n" + CH05["ex05_add_rmsnorm_kernel_code"] + "\n\n"
               + CH05["ex05_add_rmsnorm_wrapper_code"])
CH05_ANSWERS = (CH05_ANSWER + "\n\n" + _read_back(CH05_ANSWER) + "\n\n"
                + _scratch(CH05_ANSWER))
READ_BACK = "your kernel reads `residual_out` back after storing it"
SCRATCH = ("your kernel stores values into a buffer your function allocates and does not "
           "return (passed to your kernel as `scratch_ptr`) and loads them back")


@pytest.fixture(scope="module")
def ch05(tmp_path_factory):
    """Chapter 05's answer and its read-back twin, as a module of their own."""
    return _imported(tmp_path_factory, "ch05_answers", CH05_ANSWERS)


def _add_args(rows: int = 3, n: int = 100):
    # 3-D, and the residual's rows padded: the outputs' views differ from the inputs'
    return (torch.randn(rows, 2, n, device=runtime.DEVICE),
            torch.randn(rows, 2, n + 28, device=runtime.DEVICE)[..., :n],
            torch.rand(n, device=runtime.DEVICE) + 0.5)


def test_chapter_05s_answer_loads_neither_output_and_its_read_back_loads_residual_out_once(ch05):
    from course.verify.load_count import output_load_counts

    args = _add_args()
    shape = args[0].shape
    _, honest = trace_call(ch05.add_rmsnorm, args)
    _, back = trace_call(ch05.add_rmsnorm_read_back, args)
    for position in (0, 1):
        assert torch.equal(output_load_counts(honest, args, position),
                           torch.zeros(shape, dtype=torch.int32))
    assert torch.equal(output_load_counts(back, args, 0), torch.zeros(shape, dtype=torch.int32))
    assert torch.equal(output_load_counts(back, args, 1), torch.ones(shape, dtype=torch.int32))
    # the inputs' counts are unchanged: one read each
    for index in (0, 1):
        assert torch.equal(load_counts(back, args, index), torch.ones(shape, dtype=torch.int32))


def test_a_kernel_that_reads_part_of_an_output_back_is_told_how_much_and_where():
    from course.check.bandwidth import read_backs

    counts = torch.zeros(4, 8, dtype=torch.int32)
    counts[2:, :3] = 1
    assert read_backs(counts, "residual_out") == (
        "your kernel reads part of `residual_out` back after storing it: 6 of its 32 elements "
        "were loaded, up to once, in 2 of its rows (the first: row 2), extra reads that a "
        "fused kernel never makes")
    assert read_backs(torch.zeros(4, 8), "residual_out") is None


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_chapter_05_refuses_a_sum_loaded_back_from_residual_out(ch05, capsys):
    """Both inputs read once, one launch, every value right: the count of loads covered the
    inputs only, so a kernel that stored the sum and loaded it back passed."""
    import add_rmsnorm_variants

    for fn in (ch05.add_rmsnorm_read_back, add_rmsnorm_variants.sum_loaded_back):
        with pytest.raises(AssertionError) as refused:
            check.add_rmsnorm_bandwidth(fn)
        message = str(refused.value)
        assert READ_BACK in message, message
        assert "every element of `residual_out` was loaded once" in message
        assert "an extra read of M*N elements" in message
        assert "keep h in registers" in message and "h.to(tl.float32)" in message
        assert "instead of loading residual_out again" in message
    assert check.add_rmsnorm_bandwidth(ch05.add_rmsnorm) is None
    assert "needs a GPU" in capsys.readouterr().out


def _timed_check(fn, spec_dtype=torch.float32):
    from course.check.add_rmsnorm import add_rmsnorm_call_spec

    def make_args():
        return (torch.randn(16, 300, device=runtime.DEVICE),
                torch.randn(16, 300, device=runtime.DEVICE),
                torch.rand(300, device=runtime.DEVICE) + 0.5)

    return timed_bandwidth_check("add_rmsnorm 16x300", fn, make_args, 10**6,
                                 add_rmsnorm_call_spec(spec_dtype), target=0.75, reps=4)


def test_the_timed_check_refuses_a_sum_loaded_back_before_timing(ch05, fake_timer):
    """The path a GPU takes (the watched call before timing counts the loads), run here in
    the interpreter with a pretend timer."""
    with pytest.raises(AssertionError, match=f"add_rmsnorm 16x300: {READ_BACK}"):
        _timed_check(ch05.add_rmsnorm_read_back)
    assert _timed_check(ch05.add_rmsnorm).passed


@pytest.fixture(scope="module")
def ch05_learner(tmp_path_factory):
    """A learner's process, as the autograder starts it, that ran chapter 05's answer and
    its read-back twin."""
    from test_verify import started_learner

    found = started_learner(tmp_path_factory.mktemp("ch05_learner"), CH05_ANSWERS)
    yield found
    found.process.close()


def test_the_verifier_counts_the_read_back_on_the_trace_of_the_call_it_times(ch05_learner,
                                                                              fake_timer):
    """In grading the learner's function runs in its own process: the verifier counts the
    loads of the outputs on the trace it received, with the kernels rebuilt from source."""
    with pytest.raises(AssertionError, match=f"add_rmsnorm 16x300: {READ_BACK}"):
        _timed_check(ch05_learner.function("add_rmsnorm_read_back"))
    assert _timed_check(ch05_learner.function("add_rmsnorm")).passed


@pytest.mark.gpu
def test_gpu_bandwidth_check_refuses_chapter_05s_sum_loaded_back(ch05):
    import add_rmsnorm_variants

    for fn in (ch05.add_rmsnorm_read_back, add_rmsnorm_variants.sum_loaded_back):
        with pytest.raises(AssertionError, match=READ_BACK):
            check.add_rmsnorm_bandwidth(fn)
    assert check.add_rmsnorm_bandwidth(ch05.add_rmsnorm).passed


# ------------------------------- chapter 05: the sum through a scratch buffer, loaded back

def test_chapter_05s_scratch_twin_loads_its_scratch_once_and_neither_output_nor_input_twice(
        ch05):
    from course.verify.load_count import OwnMemory

    args = _add_args()
    _, honest = trace_call(ch05.add_rmsnorm, args)
    _, scratch = trace_call(ch05.add_rmsnorm_scratch, args)
    honest_memory = OwnMemory(honest, args)
    assert len(honest_memory.storages()) == 2  # y and residual_out
    for key in honest_memory.storages():
        assert not bool(honest_memory.bytes_loaded(key).any())
    memory = OwnMemory(scratch, args)
    assert len(memory.storages()) == 3
    loaded = [key for key in memory.storages() if bool(memory.bytes_loaded(key).any())]
    assert len(loaded) == 1  # the scratch buffer, and no output
    for position in (0, 1):
        assert not bool(memory.output(position).any())
    for index in (0, 1):
        assert torch.equal(load_counts(scratch, args, index),
                           torch.ones(args[0].shape, dtype=torch.int32))


@pytest.mark.skipif(runtime.on_gpu(), reason="the path without a GPU")
def test_without_a_gpu_chapter_05_refuses_a_sum_loaded_back_from_a_scratch_buffer(ch05, capsys):
    """x and the residual read once, one launch, neither output loaded, every value right:
    a buffer the wrapper allocates and does not return was counted by no one, so a kernel
    that stored the sum there and loaded it back for the norm passed."""
    import add_rmsnorm_variants

    for fn, passed_as in ((ch05.add_rmsnorm_scratch, "scratch_ptr"),
                          (add_rmsnorm_variants.scratch_read_back, "s_ptr")):
        with pytest.raises(AssertionError) as refused:
            check.add_rmsnorm_bandwidth(fn)
        message = str(refused.value)
        assert ("your kernel stores values into a buffer your function allocates and does not "
                f"return (passed to your kernel as `{passed_as}`) and loads them back") \
            in message, message
        assert "every element of that buffer was loaded once" in message
        assert ("an extra write and read of 16384 elements in the call counted (a 4 x 4096 "
                "buffer)") in message  # without a GPU the count is of 4 rows
        assert "Chapter 05 keeps the sum in registers" in message
        assert "h.to(tl.float32)" in message
    assert check.add_rmsnorm_bandwidth(ch05.add_rmsnorm) is None
    assert "needs a GPU" in capsys.readouterr().out


def test_the_timed_check_refuses_a_scratch_read_back_before_timing(ch05, fake_timer):
    """The path a GPU takes, run here in the interpreter with a pretend timer."""
    import add_rmsnorm_variants

    with pytest.raises(AssertionError, match=re.escape(f"add_rmsnorm 16x300: {SCRATCH}")):
        _timed_check(ch05.add_rmsnorm_scratch)
    with pytest.raises(AssertionError, match="passed to your kernel as `s_ptr`"):
        _timed_check(add_rmsnorm_variants.scratch_read_back)
    assert _timed_check(ch05.add_rmsnorm).passed


def test_the_verifier_counts_a_scratch_read_back_on_the_trace_of_the_call_it_times(
        ch05_learner, fake_timer):
    """In grading the learner's function runs in its own process: the verifier counts the
    loads of the call's own memory on the trace it received."""
    with pytest.raises(AssertionError, match=re.escape(f"add_rmsnorm 16x300: {SCRATCH}")):
        _timed_check(ch05_learner.function("add_rmsnorm_scratch"))
    assert _timed_check(ch05_learner.function("add_rmsnorm")).passed


@pytest.mark.gpu
def test_gpu_bandwidth_check_refuses_chapter_05s_scratch_read_back(ch05):
    import add_rmsnorm_variants

    for fn in (ch05.add_rmsnorm_scratch, add_rmsnorm_variants.scratch_read_back):
        with pytest.raises(AssertionError,
                           match="stores values into a buffer your function allocates"):
            check.add_rmsnorm_bandwidth(fn)
    assert check.add_rmsnorm_bandwidth(ch05.add_rmsnorm).passed


def test_the_call_s_own_memory_loaded_back_is_told_where_and_how_much():
    from course.check.bandwidth import own_memory_loads

    view = {"storage": "alloc:0", "dtype": torch.float32, "offset": 4, "shape": (2, 4),
            "stride": (4, 1)}
    trace = {"steps": [{"op": "alloc", "storage": "alloc:0", "nbytes": 64},
                       {"op": "launch", "kernel": "k", "grid": (2,),
                        "args": {"y_ptr": {"tensor": view}, "n": {"plain": 4}}}],
             "outputs": {"tensor": view}}
    counts = torch.zeros(64, dtype=torch.int32)
    assert own_memory_loads(trace, "alloc:0", counts, ("y",)) is None
    counts[16:24] = 2  # the first two elements of the view, twice
    assert own_memory_loads(trace, "alloc:0", counts, ("y",)) == (
        "your kernel stores values into the memory of `y`, which your function returns "
        "(passed to your kernel as `y_ptr`) and loads them back: 2 of its 8 elements were "
        "loaded twice, an extra write and read of 2 elements in the call counted (a 2 x 4 "
        "buffer) that a fused kernel never makes (it loads its inputs, and only stores the "
        "rest)")
    trace["steps"].insert(1, {"op": "copy", "target": view, "source": view})
    assert own_memory_loads(trace, "alloc:0", counts, ("y",)).startswith(
        "your wrapper copies values into the memory of `y`")



def test_a_spec_refuses_a_write_only_name_that_is_not_an_output():
    from course.check.bandwidth import CallSpec

    with pytest.raises(ValueError, match="write_only names 'h', not one of the output names"):
        CallSpec(("y", "residual_out"), lambda *a: a, (torch.float32,) * 2, write_only=("h",))
    assert CallSpec(("y",), lambda *a: a, (torch.float32,), write_only=("y",)).counts_loads
