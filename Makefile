# `make test` and `make demo` work from a fresh clone: they create .venv and install mk into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mk-installed
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all install test lit demo lint clean

all: test

$(STAMP): pyproject.toml CMakeLists.txt $(wildcard runtime/src/*.cpp runtime/src/*.h runtime/include/mk/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

lit: $(STAMP)
	$(VENV)/bin/lit -sv -j $(JOBS) test/lit

test: $(STAMP)
	$(VENV)/bin/lit -sv -j $(JOBS) test/lit
	$(PY) -m pytest -q -n $(JOBS) test/unit

demo: $(STAMP)
	$(PY) examples/demo.py

# pyright cannot follow the editable install's import hook, so it reads a symlink view of `mk`.
TYPES_VIEW := build/types/mk
lint: $(STAMP)
	$(PY) -m pip install -q ruff pyright
	rm -rf $(TYPES_VIEW) && mkdir -p $(TYPES_VIEW)
	ln -s $(CURDIR)/python/mk/* $(TYPES_VIEW)/
	for d in dialects passes interp backends tools; do ln -s $(CURDIR)/$$d $(TYPES_VIEW)/$$d; done
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

clean:
	rm -rf build $(VENV) .pytest_cache
