"""GPU-only tests are marked `gpu`; without a GPU they are skipped, with the reason shown."""

import os
import sys
from pathlib import Path

import course  # noqa: F401  (the execution mode is chosen before any test defines a kernel)
from course import runtime

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # test helpers such as rmsnorm_variants


# The files that take minutes, longest first. `make test` hands whole files to its workers
# in collection order, so these go first: started last, one of them alone would keep a
# worker busy long after the other ran out of files.
LONG_FILES = ("test_grader.py", "test_grader_workers.py", "test_grader_trust.py",
              "test_backward_diagnoses.py", "test_notebooks.py", "test_verify.py",
              "test_learner_distribution.py", "test_grade_cli.py", "test_browser.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FILES)))  # stable
    if runtime.on_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (scripts/gpu_suite.py runs it on one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def pipe():
    """A pipe's (read end, write end), closed afterwards."""
    read_fd, write_fd = os.pipe()
    yield read_fd, write_fd
    os.close(read_fd)
    os.close(write_fd)
