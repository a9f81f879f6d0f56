# Fitting LLM training into GPU memory: the course's commands.
#   make lab [LAB_OPTS=...] | lab-instructor | test | test-all | test-draws | grade [NOTEBOOKS=DIR | SUBMISSIONS=DIR] [LESSON=NN] [WORKERS=N] [BACKEND=ray] [REGRADE=1] [SEED=N] | export | lessons
#   | slides [DECKS="..."] | test-slides | bench | clean
#   make zero-torchrun [NPROC=2] [STAGE=3] [OPTIMIZER=lessons/03_zero.ipynb::ZeroAdamW]   (lesson 03 under torchrun)
# The first use of any target creates .venv with the pinned packages of requirements.txt.
# On a machine that already has torch and triton (a lent GPU box, a conda env), skip the venv:
#   make test PYTHON=python3

VENV    := .venv
ENV_OK  := $(VENV)/.installed
ifeq ($(origin PYTHON), command line)
ENV_DEP :=
BIN     :=
else
PYTHON  := $(VENV)/bin/python
ENV_DEP := $(ENV_OK)
BIN     := $(abspath $(VENV)/bin):
endif
RUN := PATH="$(BIN)$$PATH" PYTHONPATH="$(CURDIR)" $(PYTHON)

NOTEBOOKS ?=
SUBMISSIONS ?=
LESSON ?=
WORKERS ?= 0
BACKEND ?= local
REGRADE ?=
SEED ?=
GRADES ?= grades
GRADE_SOURCE := $(if $(SUBMISSIONS),--submissions $(SUBMISSIONS),--notebooks $(or $(NOTEBOOKS),lessons))

# Ray (make grade BACKEND=ray, and its test in make test) is an optional extra: requirements-ray.txt.
RAY_OK  := $(VENV)/.ray-installed
RAY_DEP := $(if $(ENV_DEP),$(RAY_OK))

# The decks (make slides, make test-slides) also need Playwright (requirements-slides.txt), npm once (reveal.js and
# KaTeX, slides/package-lock.json) and Chromium. make test installs Playwright when Chromium is present; without
# Chromium the browser tests skip (under CI they fail: .ci/run installs Chromium).
SLIDES_OK  := $(VENV)/.slides-installed
SLIDES_DEP := $(if $(ENV_DEP),$(SLIDES_OK))
CHROMIUM   := $(or $(CHROMIUM),$(shell command -v chromium || command -v chromium-browser || command -v google-chrome))
TEST_DEP   := $(ENV_DEP) $(RAY_DEP) $(if $(CHROMIUM),$(SLIDES_DEP))
DECKS ?=

.PHONY: env lab lab-instructor test test-all test-draws grade export lessons slides test-slides bench zero-torchrun clean

env: $(ENV_DEP)

$(ENV_OK): requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements.txt 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	$(VENV)/bin/pip install -q --no-deps -e . 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	$(VENV)/bin/python -c "import memfit, torch, triton, nbgrader" && touch $@

$(SLIDES_OK): requirements-slides.txt $(ENV_OK)
	$(VENV)/bin/pip install -q -r requirements-slides.txt 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	$(VENV)/bin/python -c "import playwright.sync_api" && touch $@

$(RAY_OK): requirements-ray.txt $(ENV_OK)
	$(VENV)/bin/pip install -q -r requirements-ray.txt 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	$(VENV)/bin/python -c "import ray" && touch $@

# JupyterLab refuses to start as root without --allow-root (containers, many cloud notebooks). LAB_OPTS: more
# JupyterLab options (--port=8890 --no-browser, say). make lab hides nbgrader's tools (tools/lab_learner/).
LAB_OPTS ?=
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)

lab: $(ENV_DEP)
	JUPYTER_CONFIG_DIR="$(CURDIR)/tools/lab_learner" $(RUN) -m jupyter lab lessons/ $(LAB_ROOT) $(LAB_OPTS)

lab-instructor: $(ENV_DEP)
	$(RUN) -m jupyter lab $(LAB_ROOT) $(LAB_OPTS)

# One pytest worker per core where pytest-xdist is installed (the venv has it; a bare GPU box may not); tests
# sharing a module fixture stay on one worker (xdist_group).
XDIST = $$($(PYTHON) -c 'import xdist; print("-n auto --dist loadgroup")' 2>/dev/null)
test: $(TEST_DEP)
	$(RUN) -m pytest tests -q -ra -m "not full" $(XDIST)

# Everything make test runs, and the tier it leaves out (tests/conftest.py FULL_TIER): the grading matrix, every right
# entry keeping its points, draws, the notebooks top to bottom, a class at scale. CI runs this (.ci/run).
test-all: $(TEST_DEP)
	$(RUN) -m pytest tests -q -ra $(XDIST)

slides: $(ENV_DEP) $(SLIDES_DEP)
	$(RUN) -m slides $(DECKS)

# Every right entry of every check that draws random values keeps its points on 100 draws (hours on a CPU: make test
# draws the fast checks 100 times and a few others 10, tests/test_draws.py). On a machine of N GPUs, give each
# worker one in turn: make test-draws MEMFIT_TEST_GPUS=N (and pytest-xdist's -n through PYTEST_ADDOPTS).
test-draws: $(ENV_DEP)
	MEMFIT_DRAWS=all $(RUN) -m pytest tests/test_draws.py -q -ra $(XDIST)

test-slides: $(ENV_DEP) $(SLIDES_DEP)
	$(RUN) -m pytest tests/test_slides.py -q -ra

grade: $(ENV_DEP) $(if $(filter ray,$(BACKEND)),$(RAY_DEP))
	$(RUN) -m autograder $(GRADE_SOURCE) $(if $(LESSON),--lessons $(LESSON)) --workers $(WORKERS) --backend $(BACKEND) --out $(GRADES) $(if $(REGRADE),--regrade) $(if $(SEED),--seed $(SEED))

export: $(ENV_DEP)
	$(RUN) -m autograder.export --gradebook $(GRADES)/gradebook.csv --nbgrader-csv $(GRADES)/nbgrader_export.csv \
	  --lms-csv $(GRADES)/totals.csv

lessons: $(ENV_DEP)
	$(RUN) -m tools.make_lessons

bench: $(ENV_DEP)
	$(RUN) -m benchmarks

NPROC ?= 2
STAGE ?= 3
OPTIMIZER ?= memfit.from_lessons.zero:ZeroAdamW
zero-torchrun: $(ENV_DEP)
	$(RUN) -m torch.distributed.run --standalone --nproc-per-node $(NPROC) -m memfit.zero --stage $(STAGE) --optimizer $(OPTIMIZER)

clean:
	rm -rf build grades .pytest_cache slides/build
	find . -name __pycache__ -prune -exec rm -rf {} +
