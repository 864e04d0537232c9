# `make demo` and `make test` set everything up in .venv (created if missing) and run.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz bench clean

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/quickstart.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest tests -q

FUZZ_MINUTES ?= 10
FUZZ_SEED ?= 1
fuzz: $(STAMP)
	$(VENV)/bin/python -m tests.fuzz --seed $(FUZZ_SEED) --minutes $(FUZZ_MINUTES)

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/run.py

clean:
	rm -rf $(VENV) *.egg-info
