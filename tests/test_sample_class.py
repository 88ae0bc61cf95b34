"""scripts/grade_sample_class.py's class: each student's kernels of their own source."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import grade_sample_class as sample  # noqa: E402
from grader_submissions import solutions  # noqa: E402


def kernel_sources(code: str) -> dict[str, str]:
    """name -> source of each @triton.jit function in `code`, as Triton keys its cache."""
    tree = ast.parse(code)
    return {node.name: ast.get_source_segment(code, node) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            and any("triton.jit" in ast.unparse(d) for d in node.decorator_list)}


def test_each_students_kernels_have_a_source_of_their_own():
    found = 0
    for chapter in sample.CHAPTERS:
        answers = solutions(ROOT, chapter)
        first = sample.own_kernels(answers, "student1")
        second = sample.own_kernels(answers, "student2")
        for grade_id, code in answers.items():
            theirs, others = kernel_sources(first[grade_id]), kernel_sources(second[grade_id])
            assert theirs.keys() == kernel_sources(code).keys()
            for name in theirs:  # every kernel marked with its student, nothing else changed
                assert theirs[name] != others[name]
                assert "# student1" in theirs[name]
                found += 1
            assert first[grade_id].replace("  # student1\n", "") == code
    assert found >= 8  # chapters 03 to 07 answer eight kernels


def test_the_class_has_two_wrong_chapter_04_kernels():
    subs = sample.class_of(6, ("ch01_math", "ch04_fused"), own=False)
    assert len(subs) == 12
    wrong = {s.student: s.replaced for s in subs if s.replaced}
    assert set(wrong) == {"student5", "student6"}
    assert wrong["student5"] == {"ex04_fused_code": sample.CH04_TWO_PASS_SLOW}
