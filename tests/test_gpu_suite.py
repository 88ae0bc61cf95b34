"""The GPU suite (scripts/gpu_suite.py, `make bench-gpu`) runs every test marked `gpu`: a GPU
test outside its lists would be skipped here, in CI, and never run anywhere."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def suite_lists() -> dict[str, set[str]]:
    """The test files named in gpu_suite.py's two lists, read from its source: which of them
    it runs depends on the Jupyter stack being importable, the lists do not."""
    tree = ast.parse((ROOT / "scripts" / "gpu_suite.py").read_text())
    lists = {}
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id.endswith("TEST_FILES"):
                values = {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
                lists[target.id] = lists.get(target.id, set()) | values
    return lists


def test_every_file_with_a_gpu_test_is_in_the_gpu_suite():
    lists = suite_lists()
    assert set(lists) == {"GPU_TEST_FILES", "JUPYTER_TEST_FILES"}
    listed = set().union(*lists.values())
    marked = {f"tests/{p.name}" for p in ROOT.glob("tests/test_*.py")
              if re.search(r"pytest\.mark\.gpu\b", p.read_text())}
    assert len(marked) >= 10  # the pattern still finds the marks
    assert marked - listed == set(), "GPU tests that `make bench-gpu` would never run"
    assert all((ROOT / name).is_file() for name in listed), "a listed file that is gone"
