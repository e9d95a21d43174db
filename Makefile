VENV ?= .venv
PY := $(VENV)/bin/python
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP_FLAGS := -c constraints.txt $(FIND_LINKS)
STAMP := $(VENV)/.installed
# The extras make install, make test and make lock use.
EXTRAS := dev,ray,deploy,mujoco,robotics,minatar,atari,tensorboard,wandb,lerobot
BENCH_STAMP := $(VENV)/.installed-bench
BROWSER_STAMP := $(VENV)/.browser
# d3rlpy pins gymnasium 1.0.0, so the offline peer gets a virtualenv of its own, pinned
# by constraints.txt's torch line only (the full pins hold gymnasium 1.4).
D3RLPY_VENV := .bench-venvs/d3rlpy
# TorchRL 0.14.1 (bench/windows.py's peer) takes tensordict below 0.15: a virtualenv of its own, our torch.
TORCHRL_VENV := .bench-venvs/torchrl
TORCH_PIN = $(shell grep '^torch==' constraints.txt)
MUJOCO_PIN = $(shell grep '^mujoco==' constraints.txt)
LOCK_VENV := .lock-venv

.PHONY: install deps lock repro d4rl test test-heavy wheel-smoke check docs results bench clean

# Re-install only when the project's dependency files change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

# constraints.txt pins every dependency; this re-resolves them in a fresh virtualenv with
# only the torch line held (change that line by hand to move torch).
lock:
	rm -rf $(LOCK_VENV) && python3 -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q --upgrade pip
	$(LOCK_VENV)/bin/pip install -q $(FIND_LINKS) '$(TORCH_PIN)' -e '.[$(EXTRAS)]'
	{ sed -n '1,/^torch==/p' constraints.txt; $(LOCK_VENV)/bin/pip freeze --exclude-editable | grep -v '^torch=='; } > $(LOCK_VENV)/constraints.txt
	mv $(LOCK_VENV)/constraints.txt constraints.txt && rm -rf $(LOCK_VENV)

# dvc.yaml from dvc.template.yaml: each stage depends on the rlpipe files its command imports.
deps: $(STAMP)
	$(PY) -m rlpipe.commands.stage_deps --write

# Stage commands call `rlpipe`, so the venv's bin goes first on PATH.
repro: $(STAMP)
	$(PY) -m rlpipe.commands.stage_deps  # a stale dvc.yaml would skip stages an edit touched
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc repro

# The D4RL-style MuJoCo datasets and offline runs (docs/d4rl.md): suites/d4rl at the papers'
# size (days of CPU), or with PROFILE=cpu suites/d4rl-cpu, Hopper at a budget 2 cores finish.
D4RL_DIR := suites/d4rl$(if $(filter cpu,$(PROFILE)),-cpu,)
d4rl: $(STAMP)
	$(PY) -m rlpipe.commands.stage_deps  # a stale dvc.yaml would skip stages an edit touched
	cd $(D4RL_DIR) && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(CURDIR)/$(VENV)/bin/dvc repro

# The report's browser test opens report pages in Debian's chromium, installed here where apt-get can.
$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium could not be installed: the report's browser test will be skipped"
	touch $@

# One test process per core (the learning tests use one torch thread each); tests that share
# a resource (a Ray session) declare an xdist_group, which loadgroup keeps in one process.
test: $(STAMP) $(BROWSER_STAMP)
	$(PY) -m pytest -q -n auto --dist loadgroup -m "not heavy"

# The heavy tests (MuJoCo, Fetch, the D4RL chain, FQE's ranking, the whole pipeline), kept out of the
# default suite so that it stays under 15 minutes on 2 cores; CI runs them after it.
test-heavy: $(STAMP)
	$(PY) -m pytest -q -n auto --dist loadgroup -m heavy

# rlpipe as a project installs it: its wheel, into a fresh virtualenv that already holds another
# torch (OTHER_TORCH), which must stay; the rest comes from constraints.txt less its torch line.
# tests/wheel_smoke.sh then collects, trains and evaluates from outside the repository. The wheel is
# built from a copy of the sources: setuptools' build/ would keep deleted modules between builds.
OTHER_TORCH ?= 2.14.1
SMOKE_DIR := .wheel-smoke
SMOKE_PIP := $(SMOKE_DIR)/venv/bin/pip -q
wheel-smoke:
	rm -rf $(SMOKE_DIR) && mkdir -p $(SMOKE_DIR)/src && cp -r pyproject.toml README.md rlpipe $(SMOKE_DIR)/src/
	python3 -m venv $(SMOKE_DIR)/venv && $(SMOKE_PIP) install --upgrade pip
	$(SMOKE_PIP) wheel --no-deps -w $(SMOKE_DIR)/dist $(SMOKE_DIR)/src
	grep -v '^torch==' constraints.txt > $(SMOKE_DIR)/constraints-no-torch.txt
	$(SMOKE_PIP) install $(FIND_LINKS) -c $(SMOKE_DIR)/constraints-no-torch.txt 'torch==$(OTHER_TORCH)'
	$(SMOKE_PIP) install $(FIND_LINKS) -c $(SMOKE_DIR)/constraints-no-torch.txt $(SMOKE_DIR)/dist/rlpipe-*.whl
	$(SMOKE_DIR)/venv/bin/pip check
	$(SMOKE_DIR)/venv/bin/python -c 'import torch; print("torch", torch.__version__); assert torch.__version__.split("+")[0] == "$(OTHER_TORCH)"'
	tests/wheel_smoke.sh $(SMOKE_DIR)/venv $(OTHER_TORCH)

# Lint, format and type checks (.ci/run runs them beside the tests).
check: $(STAMP)
	$(VENV)/bin/ruff check rlpipe tests bench
	$(VENV)/bin/ruff format --check rlpipe tests bench
	$(VENV)/bin/mypy rlpipe

# The documentation site (mkdocs) into site/; broken links fail the build.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

# docs/results.md from the pipeline's metrics (after make repro).
results: $(STAMP)
	$(VENV)/bin/rlpipe report 'models/*' --out report --datasets datasets --ope ope/fqe-pendulum-mixed.json --markdown docs/results.md

# Peers for the side-by-side benchmarks (Minari's DataCollector needs jax, SB3, d3rlpy).
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[dev,bench]'
	test -x $(D3RLPY_VENV)/bin/python || python3 -m venv $(D3RLPY_VENV)
	$(D3RLPY_VENV)/bin/pip install -q $(FIND_LINKS) d3rlpy==2.8.1 '$(TORCH_PIN)' '$(MUJOCO_PIN)' imageio==2.38.2  # MuJoCo: bench/d4rl_peer.py's Hopper
	test -x $(TORCHRL_VENV)/bin/python || python3 -m venv $(TORCHRL_VENV)
	$(TORCHRL_VENV)/bin/pip install -q $(FIND_LINKS) torchrl==0.14.1 tensordict==0.14.3 '$(TORCH_PIN)'
	touch $(BENCH_STAMP)

# Every benchmark in bench/; figures go to docs/benchmarks.md by hand, with the command.
bench: $(BENCH_STAMP)
	for script in bench/*.py; do case $$script in */_*) continue;; esac; echo "== $$script"; $(PY) $$script || exit 1; done

# The peers' own readers of rlpipe's exports (bench/format_readers.py), a virtualenv each beside
# d3rlpy's; minari's HDF5 storage imports PIL, which none of its extras declares.
HF_VENV := .bench-venvs/hf
MINARI_VENV := .bench-venvs/minari
OGBENCH_VENV := .bench-venvs/ogbench
.PHONY: format-readers
format-readers: $(BENCH_STAMP)
	test -x $(HF_VENV)/bin/python || python3 -m venv $(HF_VENV)
	$(HF_VENV)/bin/pip install -q $(FIND_LINKS) datasets==5.2.0
	test -x $(MINARI_VENV)/bin/python || python3 -m venv $(MINARI_VENV)
	$(MINARI_VENV)/bin/pip install -q $(FIND_LINKS) 'minari[hdf5]==0.5.4' pillow==13.0.0
	test -x $(OGBENCH_VENV)/bin/python || python3 -m venv $(OGBENCH_VENV)
	$(OGBENCH_VENV)/bin/pip install -q $(FIND_LINKS) ogbench==1.2.2
	$(PY) bench/format_readers.py

clean:
	rm -rf $(VENV) .bench-venvs $(LOCK_VENV) $(SMOKE_DIR) .pytest_cache
