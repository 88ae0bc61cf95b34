"""Execution mode and GPU specs: chosen at import, explained when misused."""

from __future__ import annotations

import subprocess
import sys

from course import hardware, runtime

import pytest


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    # A fresh interpreter, as a learner starts one: without the TRITON_INTERPRET that
    # importing course set in this test process.
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**base, **env}, timeout=120)


def test_without_a_gpu_the_interpreter_is_switched_on_before_kernels_exist():
    proc = _python("import course, os; print(course.MODE, os.environ['TRITON_INTERPRET'])",
                   COURSE_DEVICE="cpu")
    assert proc.stdout.split() == ["interpreter", "1"], proc.stderr


@pytest.mark.skipif(runtime.on_gpu(), reason="the trap only exists in interpreter mode")
def test_importing_triton_first_is_refused_with_the_fix():
    proc = _python("import triton.language\nimport course")
    assert proc.returncode != 0
    assert "triton was imported before course" in proc.stderr
    assert "import course` first" in proc.stderr


@pytest.mark.parametrize("triton_version, numpy_version, refused", [
    ("3.6.0", "2.4.0", "NumPy 2.4.0"), ("3.6.0+git1a2b", "3.0", "NumPy 3.0"),
    ("3.5.1", "2.3.5", "need Triton 3.6"), ("3.2.0", "1.26.4", "need Triton 3.6"),
    ("3.6.0", "2.3.5", None), ("3.7.0", "2.4.6", None), ("3.9.0", "2.5.0rc1", None)])
def test_an_interpreter_the_checks_cannot_use_is_named(triton_version, numpy_version,
                                                         refused):
    """Triton 3.6's interpreter with NumPy 2.4 failed every kernel with a loop (seen on the
    GPU machine's image, Python 3.12, with its GPU hidden); with Triton 3.5's, every check
    saw no launch (run here on the CPU)."""
    why = runtime.interpreter_mismatch(triton_version, numpy_version)
    assert (why is None) == (refused is None), why
    if refused:
        assert refused in why and f"Triton {triton_version}" in why, why
        assert "pip install 'triton>=3.7'" in why, why


def test_bad_course_device_value_is_named():
    proc = _python("import course", COURSE_DEVICE="tpu")
    assert "COURSE_DEVICE must be 'cpu', 'cuda' or 'compile', not 'tpu'" in proc.stderr


def test_compile_mode_leaves_kernels_to_the_compiler():
    proc = _python("import course, os; print(course.MODE, os.environ.get('TRITON_INTERPRET'))\n"
                   "print(course.banner())", COURSE_DEVICE="compile")
    mode, banner = proc.stdout.splitlines()
    assert mode.split() == ["compile", "None"], proc.stderr
    assert "nothing runs" in banner
    proc = _python("import course", COURSE_DEVICE="compile", TRITON_INTERPRET="1")
    assert "COURSE_DEVICE=compile needs compiled-mode Triton" in proc.stderr


@pytest.mark.skipif(runtime.on_gpu(), reason="checks the message shown without a GPU")
def test_asking_for_cuda_without_a_gpu_says_so():
    proc = _python("import course", COURSE_DEVICE="cuda")
    assert "torch sees no CUDA GPU" in proc.stderr


@pytest.mark.parametrize("device_name, spec_name", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A10G", "A10"),
    ("NVIDIA L4", "L4"),
    ("Tesla T4", "T4"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
])
def test_device_names_map_to_their_spec_rows(device_name, spec_name):
    assert hardware.spec_by_name(device_name).name == spec_name


def test_unknown_gpu_has_no_spec_and_lookup_names_the_known_ones():
    assert hardware.spec_by_name("NVIDIA Quadro K600") is None
    with pytest.raises(KeyError, match="known: B200"):
        hardware.lookup("H300")


def test_peak_flops_use_fp32_cores_where_a_chip_has_no_bf16_tensor_cores():
    import torch

    t4 = hardware.lookup("T4")
    assert t4.peak_flops(torch.bfloat16) == t4.peak_flops(torch.float32) == 8.1e12
    assert hardware.lookup("H100 SXM").peak_flops(torch.bfloat16) == 989e12


@pytest.mark.skipif(runtime.on_gpu(), reason="checks the message shown without a GPU")
def test_measurements_without_a_gpu_raise_needs_gpu():
    for measure in (hardware.copy_bandwidth, hardware.broadcast_bandwidth,
                    hardware.launch_overhead):
        with pytest.raises(hardware.NeedsGPU, match="needs a GPU"):
            measure()


@pytest.mark.gpu
def test_gpu_copy_bandwidth_is_measured_below_the_published_peak():
    measured = hardware.copy_bandwidth()
    spec = hardware.current()
    assert measured > 1e11
    if spec is not None:
        assert measured < spec.hbm_bytes_per_s
    assert hardware.copy_bandwidth() == measured  # cached per process


def test_demonstration_timings_run_on_a_gpu_but_not_while_grading(monkeypatch):
    monkeypatch.delenv(runtime.GRADING_ENV, raising=False)
    assert not runtime.grading()
    assert runtime.timing_demos() == runtime.on_gpu()
    monkeypatch.setenv(runtime.GRADING_ENV, "1")
    assert runtime.grading() and not runtime.timing_demos()
    monkeypatch.setenv(runtime.GRADING_ENV, "0")
    assert not runtime.grading()
