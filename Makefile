# The README's two commands: `make run` (set up + main job) and `make test` (set up + tests).
# CPU installs pin the CPU build of torch through constraints-cpu.txt, installed first so
# that no dependency pulls a multi-GB CUDA build. GPU users: see README ("Other systems").

PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
SYSTEM   ?= cpu
PROFILE  ?= quick
OUTPUTS  ?= outputs
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
STUDY_NOTEBOOKS := $(filter-out notebooks/report.ipynb,$(NOTEBOOKS))
CONSTRAINTS ?= constraints-cpu.txt
PIP      := $(BIN)/python -m pip install --disable-pip-version-check -q -c $(CONSTRAINTS)

.PHONY: install run test lab strip-notebooks clean-outputs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(PIP) torch
	$(PIP) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Every study notebook on $(SYSTEM) with $(PROFILE): executed notebooks, records and figures under $(OUTPUTS)/;
# then the cross-system report of every record there (notebooks/report.ipynb) as $(OUTPUTS)/report.html.
run: install
	@mkdir -p $(OUTPUTS)/notebooks
	@set -e; for nb in $(STUDY_NOTEBOOKS); do \
	  name=$$(basename $$nb .ipynb); \
	  echo "== $$name on $(SYSTEM) ($(PROFILE))"; \
	  $(BIN)/papermill --cwd notebooks -k python3 $$nb $(OUTPUTS)/notebooks/$$name-$(SYSTEM)-$(PROFILE).ipynb \
	    -p system $(SYSTEM) -p profile $(PROFILE); \
	done
	@echo "== report"
	@$(BIN)/papermill --cwd notebooks -k python3 notebooks/report.ipynb $(OUTPUTS)/notebooks/report.ipynb \
	  -p out $(abspath $(OUTPUTS))/report.html
	@echo "results: $(OUTPUTS)/<study>/<system>.jsonl, figures: $(OUTPUTS)/<study>/figures/, notebooks: $(OUTPUTS)/notebooks/"
	@echo "report: $(OUTPUTS)/report.html (opens offline; accel-kit report A/outputs B/outputs merges machines)"

# Unit tests, notebooks end to end (papermill), and nbval over notebooks/ with the seconds-long smoke profile
# (make run runs the quick one); results go to a scratch folder.
test: install
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	ACCEL_KIT_OUTPUT_DIR=$$scratch ACCEL_KIT_NOTEBOOK_PROFILE=smoke $(BIN)/python -m pytest tests notebooks --nbval-lax -p no:cacheprovider

# JupyterLab in the project root, from the venv. Jupyter refuses to run as root without
# --allow-root (containers, CI machines); extra flags: make lab LAB_ARGS='--port 8899 --no-browser'.
LAB_ARGS ?=
lab: install
	$(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Tracked notebooks back to the form JupyterLab saves, without outputs (tests/test_notebooks_clean.py checks it).
strip-notebooks: install
	$(BIN)/python -m accel_kit.notebooks_meta

clean-outputs:
	find $(OUTPUTS) -mindepth 1 ! -name README.md -delete
