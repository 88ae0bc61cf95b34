# Two commands matter: `make lab` and `make test`. Each builds .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.installed
# A CPU build where there is no GPU, a CUDA build where there is one (pip picks).
TORCH_SPEC ?= torch==2.13.0
PORT ?= 8888
# Extra JupyterLab flags, e.g. LAB_ARGS=--allow-root inside a container.
LAB_ARGS ?=

# nbgrader runs `alembic` as a subprocess: the venv's bin/ must be on PATH.
export PATH := $(BIN):$(PATH)

.PHONY: lab test browser doctor release bench-gpu clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab --port=$(PORT) --notebook-dir=notebooks $(LAB_ARGS)

# The suite runs on TEST_WORKERS processes, a test file each at a time (the grader's
# end-to-end tests alone take minutes on one core), longest files first
# (tests/conftest.py orders them; xdist would otherwise put files with many tests first).
TEST_WORKERS ?= 2

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# tests/test_browser.py drives Debian's Chromium through Playwright (never `playwright
# install`: it downloads a browser). Installed here where apt-get can run as root; anywhere
# else, or if the install fails, that test skips and says what is missing.
browser:
	@command -v chromium >/dev/null || \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		echo "installing Debian's chromium for tests/test_browser.py"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
		echo "could not install chromium: tests/test_browser.py will skip"; \
	else \
		echo "no chromium, and no apt-get as root to install it: tests/test_browser.py will skip"; \
	fi

doctor: $(STAMP)
	$(BIN)/python -m course doctor

# notebooks/ from solutions/ with nbgrader generate_assignment (scripts/release.py says how).
release: $(STAMP)
	$(BIN)/python scripts/release.py

# The instructor's steps after `make release` (grader/README.md says more):
#   make collect FROM=<folder>    <folder>/<student>/<chapter>/<chapter>.ipynb -> grader/submitted/
#   make autograde [CHAPTERS=ch01_math,ch04_fused] [STUDENTS=a,b] [FORCE=1] [CELL_TIMEOUT=s]
#                  [GPUS=0,1,...]   a worker per GPU (grader/README.md: a cluster, with Slurm)
#                  [CHAPTERS_AT_ONCE=n]  a student's chapters side by side (default: cores / 2)
#   make feedback [CHAPTERS=...]  HTML per submission in grader/feedback/
#   make override CHAPTER=ch04_fused STUDENT=alice CELL=ex04_fused_correct POINTS=4 REASON="..."
#                                 the instructor's decision on one test cell (REMOVE=1 drops it)
#   make grades                   grader/grades.csv, per test cell, verdicts and integrity flags
.PHONY: collect autograde feedback grades override
INSTRUCTOR := $(BIN)/python grader/instructor.py

collect: $(STAMP)
	$(if $(FROM),,$(error make collect needs FROM=<folder holding <student>/<chapter>/ folders>))
	$(INSTRUCTOR) collect "$(FROM)"

autograde: $(STAMP)
	$(INSTRUCTOR) autograde $(if $(CHAPTERS),--chapters "$(CHAPTERS)") \
		$(if $(STUDENTS),--students "$(STUDENTS)") $(if $(FORCE),--force) \
		$(if $(CELL_TIMEOUT),--cell-timeout "$(CELL_TIMEOUT)") $(if $(GPUS),--gpus "$(GPUS)") \
		$(if $(CHAPTERS_AT_ONCE),--chapters-at-once "$(CHAPTERS_AT_ONCE)")

feedback: $(STAMP)
	$(INSTRUCTOR) feedback $(if $(CHAPTERS),--chapters "$(CHAPTERS)")

override: $(STAMP)
	$(if $(and $(CHAPTER),$(STUDENT),$(CELL),$(REASON)),,$(error make override needs CHAPTER= STUDENT= CELL= REASON="why" and POINTS= or REMOVE=1))
	$(INSTRUCTOR) override "$(CHAPTER)" "$(STUDENT)" "$(CELL)" $(POINTS) --reason "$(REASON)" \
		$(if $(REMOVE),--remove)

grades: $(STAMP)
	$(INSTRUCTOR) grades

# The two distributions, as wheels (scripts/build_dist.py says what each holds):
#   make dist              the learners' (`course` alone): dist/norm_kernels-<version>-py3-none-any.whl
#   make dist-instructor   the instructor's (`course` and solutions.kernels): dist/instructor/
.PHONY: dist dist-instructor
dist: $(STAMP)
	$(BIN)/python scripts/build_dist.py learner

dist-instructor: $(STAMP)
	$(BIN)/python scripts/build_dist.py instructor

# On a GPU machine: the GPU-only tests and measurements, in one process tree.
bench-gpu: $(STAMP)
	$(BIN)/python scripts/gpu_suite.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
