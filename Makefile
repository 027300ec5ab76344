# One-command entry points. Each target creates the virtual environment and
# installs jointlab on first use, so `make demo` and `make test` work on a
# fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Pinned for dev and CI: 2.13.0 is a CPU build available from local disk.
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.jointlab-installed

.PHONY: install demo test lint fuzz bench binder colab notebooks clean

# Each step says what it does; pip shows its own progress (no -q: a fresh install
# takes minutes, and a silent terminal looks hung).
$(STAMP): pyproject.toml
	@echo "==> [1/4] virtual environment $(VENV)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "==> [2/4] upgrading pip"
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "==> [3/4] installing $(TORCH_PIN) (a large download on a fresh machine: this takes a few minutes)"
	$(PY) -m pip install --progress-bar on "$(TORCH_PIN)"
	@echo "==> [4/4] installing jointlab with its notebook and dev extras (JupyterLab, pytest, transformers, ...)"
	$(PY) -m pip install --progress-bar on -e ".[dev]" "$(TORCH_PIN)"
	touch $(STAMP)
	@echo "==> installed. Open the notebooks with: $(VENV)/bin/jupyter lab notebooks/"

install: $(STAMP)

demo: $(STAMP)
	@echo "==> demo: trace the demo GPT, check it against eager autograd, write out/jointlab-demo.html"
	$(PY) -m jointlab demo --out out/jointlab-demo.html
	@echo "==> open out/jointlab-demo.html in a browser, or the notebooks: $(VENV)/bin/jupyter lab notebooks/"

lint: $(STAMP)
	$(PY) -m ruff check jointlab tests bench

# Besides the 25 fixed fuzz examples per mode, every run fuzzes a fresh random sample
# (JOINTLAB_FUZZ_EXAMPLES per mode, default 6); its seed is in the pytest header.
# Replay a failure: JOINTLAB_FUZZ_SEED=<seed> make test (or pytest tests/fuzz -k random_sample).
test: $(STAMP) lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25 tests

# A simulated Binder build (binder/requirements.txt, postBuild) in a fresh venv under
# a temporary folder, then every notebook in it. Not part of `make test` (several
# minutes); the lighter simulated Colab install (tests/test_hosts.py) is.
binder: $(STAMP)
	$(PY) -m pytest -q -s -m binder tests/test_hosts.py

# Colab's published stack (tests/hostsim.py COLAB_HOST: torch 2.11.0, ipywidgets 7.7.1,
# plotly 5.24.1, ... on Python 3.13 where this machine has it) built once and cached under
# ~/.cache/jointlab-hostsim (the first run downloads torch 2.11, about 2.6 GB), then
# notebooks 01, 03 and 05 with their own setup cell. Not part of `make test`, which runs
# the lighter check (Colab's versions with the dev torch, and a resolver check).
colab: $(STAMP)
	$(PY) -m pytest -q -s -m colab tests/test_hosts.py

fuzz: $(STAMP)
	$(PY) -m pytest -q -m slow tests

bench: $(STAMP)
	$(PY) bench/run.py --json bench/results.json

clean:
	rm -rf $(VENV) out .pytest_cache
