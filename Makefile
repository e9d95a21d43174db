VENV ?= .venv
PY := $(VENV)/bin/python
PIP_FLAGS := -c constraints.txt $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
STAMP := $(VENV)/.installed

.PHONY: install repro test bench clean

# Re-install only when the project's dependency files change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_FLAGS) -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Stage commands call `rlpipe`, so the venv's bin goes first on PATH.
repro: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/dvc repro

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
