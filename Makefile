# `make demo` and `make test` set everything up in .venv (created if missing) and run.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz bench clean

# The several-process tests (tinyjax.distributed) run under mpiexec from the `mpi` extra (mpi4py and the MPICH wheel).
# The OpenCL tests run the GPU kernels on PoCL, a CPU OpenCL: Debian's pocl-opencl-icd (installed here when running as
# root with apt-get) and pyopencl (the `opencl` extra). Where either cannot be had, those tests skip and say why.
$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	@test -e /etc/OpenCL/vendors/pocl.icd || \
	  { test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
	    { apt-get install -y -qq pocl-opencl-icd >/dev/null 2>&1 || \
	      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq pocl-opencl-icd >/dev/null 2>&1; }; }; } || \
	  echo "PoCL could not be installed (sudo apt-get install pocl-opencl-icd): the OpenCL tests will skip"
	$(VENV)/bin/python -m pip install -q -e '.[test,opencl]' || \
	  echo "pyopencl could not be installed: the OpenCL tests will skip"
	$(VENV)/bin/python -m pip install -q -e '.[test,mpi]' || \
	  echo "mpi4py / mpich could not be installed: the several-process tests will skip"
	touch $(STAMP)

# the demo trains the CNN for one epoch on Fashion-MNIST, installing Debian's dataset-fashion-mnist when it can (as
# root); without it, examples/cnn.py says so and trains on a built-in synthetic task
demo: $(STAMP)
	@test -d /usr/share/datasets/fashion-mnist || test -n "$$TINYJAX_DATA" || \
	  { test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
	    { apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1; }; }; } || \
	  echo "Fashion-MNIST could not be installed (sudo apt-get install dataset-fashion-mnist)"
	$(VENV)/bin/python examples/quickstart.py
	$(VENV)/bin/python examples/cnn.py --epochs 1

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
