VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS := -c constraints.txt $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
BROWSER_STAMP := $(VENV)/.browser
# d3rlpy pins gymnasium 1.0.0, so the offline peer gets a virtualenv of its own.
D3RLPY_VENV := .bench-venvs/d3rlpy

.PHONY: install repro d4rl test bench clean

# Re-install only when the project's dependency files change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[dev,ray,deploy,mujoco,robotics]'
	touch $(STAMP)

install: $(STAMP)

# Stage commands call `rlpipe`, so the venv's bin goes first on PATH.
repro: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc repro

# The D4RL-style MuJoCo datasets and offline runs (benchmarks/d4rl; days of CPU at full size: docs/d4rl.md).
d4rl: $(STAMP)
	cd benchmarks/d4rl && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(CURDIR)/$(VENV)/bin/dvc repro

# The report's browser test opens report pages in Debian's chromium, installed here where apt-get can.
$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium could not be installed: the report's browser test will be skipped"
	touch $@

# One test process per core (the learning tests use one torch thread each); tests that share
# a resource (a Ray session) declare an xdist_group, which loadgroup keeps in one process.
test: $(STAMP) $(BROWSER_STAMP)
	$(PY) -m pytest -q -n auto --dist loadgroup

# Peers for the side-by-side benchmarks (Minari's DataCollector needs jax, SB3, d3rlpy).
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[dev,bench]'
	test -x $(D3RLPY_VENV)/bin/python || python3 -m venv $(D3RLPY_VENV)
	$(D3RLPY_VENV)/bin/pip install -q $(PIP_FLAGS) d3rlpy==2.8.1
	touch $(BENCH_STAMP)

# Every benchmark in bench/; figures go to docs/benchmarks.md by hand, with the command.
bench: $(BENCH_STAMP)
	for script in bench/*.py; do case $$script in */_*) continue;; esac; echo "== $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .bench-venvs .pytest_cache
