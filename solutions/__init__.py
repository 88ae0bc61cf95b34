"""Instructor side of the course: nbgrader source notebooks (one folder per chapter) and
`solutions.kernels`, the tuned reference kernels the course measures itself by."""
