"""Grading that the learner's code cannot reach (DESIGN.md, "Grading trust model").

A submission's code runs in a process of its own (`learner`); the test cells run in the
verifier's process (`verifier`), where the inputs are made, the references computed and
the outputs compared, calling the learner's functions through stand-ins (`proxy`) over a
pair of pipes (`protocol`). The learner's process watches each call as the checkers do in
one process, and reports when code replaced what the checks rely on (`tamper`).

    python -m course.verify SUBMITTED SOURCE --out VERDICT.json
"""
