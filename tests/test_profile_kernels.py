"""scripts/profile_kernels.py: per-kernel device times of each implementation."""

import subprocess
import sys
from pathlib import Path

import course  # noqa: F401  (mode first)
from course import peers, runtime, shootout

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import profile_kernels  # noqa: E402


@pytest.mark.skipif(runtime.on_gpu(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_refuses_with_a_reason():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_kernels.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode != 0
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.gpu
def test_ours_backward_shows_its_two_kernels():
    sets = [shootout.make_inputs("rmsnorm_bwd", 4096, 1024, torch.bfloat16, seed=s)
            for s in range(2)]
    ours = peers.implementations("rmsnorm_bwd")[0]
    rows = profile_kernels.kernel_times([ours.prepare(t, 1e-6) for t in sets], reps=5)
    names = [name for _, _, name in rows]
    assert any("rmsnorm_bwd_rows_kernel" in n for n in names)
    assert any("column_sums_kernel" in n for n in names)
    assert all(us > 0 and launches >= 1 for us, launches, _ in rows)
