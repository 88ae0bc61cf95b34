"""GPU-only tests are marked `gpu`; without a GPU they are skipped, with the reason shown."""

import sys
from pathlib import Path

import course  # noqa: F401  (the execution mode is chosen before any test defines a kernel)
from course import runtime

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # test helpers such as rmsnorm_variants


def pytest_collection_modifyitems(config, items):
    if runtime.on_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_suite.py runs it on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
