# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastcrit-installed

.PHONY: install demo test bench clean

install: $(STAMP)

# torch==2.13.0 first: the CPU build lies on this machine's disk; any later range it satisfies
# installs nothing more.
$(STAMP): setup.py kernels/pyproject.toml CMakeLists.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

demo: install
	$(BIN)/fastcrit train configs/cpu/grpo.yaml

test: install
	$(BIN)/python -m pytest -q -ra tests

# Every benchmark, one after another (each also runs alone: python benchmarks/bench_<thing>.py).
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info runs
