"""nbgrader configuration of the course (see DESIGN.md, "nbgrader mapping").

nbgrader finds this file when it runs from grader/, which is where scripts/release.py and
grader/instructor.py run it (nbgrader 0.9.6 has no `--config` option). Paths are taken from
this file's location, so the same configuration works in a copy of the course.

    solutions/<chapter>/<chapter>.ipynb   source notebooks: solutions and hidden tests
    notebooks/<chapter>/<chapter>.ipynb   release notebooks (`make release` writes them)
    grader/submitted, autograded, feedback, gradebook.db   instructor's working state
                                          (git-ignored)

One assignment per chapter (ch00_setup, ch01_math, ...): a crash in one chapter cannot cost
another chapter's points. solutions/kernels/ holds reference kernels, not an assignment.
"""

import os
from pathlib import Path

c = get_config()  # noqa: F821  (nbgrader defines get_config when it loads this file)

COURSE_ROOT = Path(__file__).resolve().parent.parent
GRADER_DIR = COURSE_ROOT / "grader"

c.CourseDirectory.root = str(COURSE_ROOT)
c.CourseDirectory.course_id = "norm_kernels"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
# The instructor's working folders live under grader/, next to this file (all git-ignored).
c.CourseDirectory.submitted_directory = "grader/submitted"
c.CourseDirectory.autograded_directory = "grader/autograded"
c.CourseDirectory.feedback_directory = "grader/feedback"
c.CourseDirectory.solution_directory = "grader/solution"
c.CourseDirectory.source_with_tests_directory = "grader/source_with_tests"
c.CourseDirectory.db_url = f"sqlite:///{GRADER_DIR / 'gradebook.db'}"

# What a learner finds in place of a solution. Inside a function the `raise` fires when the
# function is called (by the test cell, usually). Lines stay short: nested four levels deep,
# the stub must still fit ruff's 100 columns.
c.ClearSolutions.code_stub = {
    "python": "# YOUR CODE HERE (then run this cell, and the test cell after it)\n"
              "raise NotImplementedError(\"write your solution here, in place of this line\")",
}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE: replace this line with your answer."

# `nbgrader autograde` runs none of a submission's cells: the verifier
# (`python -m course.verify`, started by grader/instructor.py) runs them once, apart from
# the test cells, and its points and outputs replace these (`apply_verdicts`, `annotate`).
# In place of nbgrader's Execute, every autograded test cell gets an error output saying it
# awaits the verifier, so that the score nbgrader records from the outputs is 0 until then
# (every export, feedback and merge puts the verified points in first).
try:
    import nbformat
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute, NbGraderPreprocessor
    from nbgrader.utils import is_grade, is_solution
except ImportError:  # the Jupyter stack is missing: nbgrader itself says so
    pass
else:
    class AwaitVerification(NbGraderPreprocessor):
        """Each autograded test cell: an error output saying that it is not verified yet."""

        def preprocess_cell(self, cell, resources, index):
            if cell.cell_type == "code" and is_grade(cell) and not is_solution(cell):
                cell.outputs = [nbformat.v4.new_output(
                    "error", ename="NotVerified",
                    evalue="scored 0 until the verifier grades this cell",
                    traceback=["NotVerified: this cell scores 0 until `grader/instructor.py "
                               "autograde` verifies the submission"])]
            return cell, resources

    # First, before nbgrader records any score from the outputs.
    c.Autograde.autograde_preprocessors = [AwaitVerification] + [
        step for step in Autograde.class_traits()["autograde_preprocessors"].default()
        if step is not Execute]

# The time limit per cell of the verifier's runs and of `course grade` (the learner's own
# grading, which reads this section). A cell that runs longer than this is
# interrupted and recorded as an error, so a hanging kernel (an infinite loop in a kernel,
# a deadlocked launch) costs that cell's points, not the whole grading run. The longest
# legitimate cells are checkers compiling a dozen kernel variants and timing them on a GPU,
# or running them in Triton's interpreter on a machine without one.
# GRADER_CELL_TIMEOUT_S overrides it (`make autograde CELL_TIMEOUT=...`, the tests' short
# limit), so that the message below always states the limit that applied.
_timeout_setting = os.environ.get("GRADER_CELL_TIMEOUT_S", "300")
if not _timeout_setting.strip().isdigit() or int(_timeout_setting) <= 0:
    raise ValueError(f"GRADER_CELL_TIMEOUT_S must be a whole number of seconds above 0, "
                     f"not {_timeout_setting!r}")
CELL_TIMEOUT_S = int(_timeout_setting)
c.Execute.timeout = CELL_TIMEOUT_S
c.Execute.interrupt_on_timeout = True
# After the interrupt, the kernel of `course grade` has this long to stop and report. A cell
# that ignores the interrupt (a GPU kernel that never returns holds the process inside CUDA,
# where Python's SIGINT handler cannot run) has its kernel killed; the verifier kills the
# learner's process instead and runs the notebook again in a new one, past that cell.
c.Execute.iopub_timeout = 10
c.Execute.error_on_timeout = {
    "ename": "CellTimeoutError",
    "evalue": f"stopped after {CELL_TIMEOUT_S} s",
    "traceback": [
        f"CellTimeoutError: this cell ran longer than {CELL_TIMEOUT_S} s and was stopped. "
        "Look for a loop that never ends in your kernel or wrapper (a loop bound that "
        "never changes, a grid that is far too large).",
    ],
}

# How the notebooks' kernels are started, by `course grade` (which reads this section) and
# by nbgrader wherever it runs a notebook. Over plain TCP, ipykernel warns on the stderr of
# every kernel ("Kernel is running over TCP without encryption"), into every learner's
# terminal, about nothing they did. With CurveZMQ, which pyzmq's wheels include, the kernel
# manager gives each kernel its own keys and the messages are encrypted; the kernelspec of
# ipykernel declares support for it ("auto" uses it only then). Older jupyter_client
# versions have no such setting (nor that warning), and pyzmq built without CurveZMQ
# refuses it: both are left as they are.
try:
    import zmq
    from jupyter_client.manager import KernelManager
except ImportError:  # nbgrader needs both; a broken install is reported by nbgrader itself
    pass
else:
    if zmq.has("curve") and "transport_encryption" in KernelManager.class_trait_names():
        c.KernelManager.transport_encryption = "auto"
