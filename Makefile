# The two commands a new user needs. Both create or refresh .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stream-anon demo --report reports/demo.json

# the broker tests mostly wait on the broker and worker subprocesses: four pytest processes (whole files each, so a
# module's fixtures are built once) keep 2 cores busy. The broker tests run on Tansu and, with java and mvn present,
# on Apache Kafka (one per pytest process, reused), those marked one_broker on one of them (tests/conftest.py,
# docs/brokers.md); --broker tansu|apache after `pytest` keeps one
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 4 --dist loadfile --durations=25

# the tests that need no broker (tests/conftest.py marks the others `kafka` from the fixtures they request)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not kafka" --durations=15

bench: $(STAMP)
	$(BIN)/python bench/bench_guard.py
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_castle.py
	$(BIN)/python bench/bench_end_to_end.py

clean-venv:
	rm -rf $(VENV)
