# The two commands a new user needs. Both create or refresh .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,eval]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stream-anon demo --report reports/demo.json

# the broker tests mostly wait on the broker and worker subprocesses: one pytest process per core (whole files,
# so a module's fixtures are built once) halves the wall time
test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile --durations=25

bench: $(STAMP)
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_castle.py
	$(BIN)/python bench/bench_end_to_end.py

clean-venv:
	rm -rf $(VENV)
