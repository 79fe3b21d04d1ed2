# The same commands locally and in CI. `make lab` and `make test` set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.steerlab-installed
PYTEST := $(PY) -m pytest

.PHONY: setup lab test test-fast lint bench browser toy clean

setup: $(STAMP) browser

# torch first, from the pinned CPU wheel, so the package's torch>=2.6 finds it satisfied
# instead of pulling the CUDA build.
$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[notebook,server,dev]"
	touch $(STAMP)

# Figure export (kaleido) and the JupyterLab browser test need a Chromium.
browser:
	@bash scripts/install_browser.sh || echo "warning: no Chromium; static figure export (PNG/SVG/PDF) and browser tests need one (see README)"

# The venv's bin goes first on PATH so notebook kernels run the venv's Python; root (a
# container) needs --allow-root. Lab serves the repository, so that tutorials/ and notebooks/
# are both reachable, and opens on tutorials/; test plumbing is hidden from the file browser.
LAB_HIDDEN := ["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", "conftest.py", "sanitize.cfg"]
lab: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyter lab \
		--ServerApp.root_dir="$(CURDIR)" --LabApp.default_url=/lab/tree/tutorials \
		'--ContentsManager.hide_globs=$(LAB_HIDDEN)' $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup
	$(PYTEST) -q -rs -p no:cacheprovider tests tutorials notebooks --nbval-lax --nbval-sanitize-with tutorials/sanitize.cfg --durations=15

test-fast: $(STAMP)
	$(PYTEST) -q -rs -m "not browser and not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check steerlab tests benchmarks
	$(VENV)/bin/ruff format --check steerlab tests benchmarks
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) benchmarks/run.py

toy: $(STAMP)
	$(PY) -m steerlab.toy.train

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
