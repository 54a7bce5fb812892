# The two commands a new user needs. Both create or refresh .venv in the repo root.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stream-anon demo --report reports/demo.json

# the broker tests mostly wait on the broker and worker subprocesses (two pytest processes kept 2 cores 53% busy):
# three pytest processes (whole files each, so a module's fixtures are built once) on 2 cores. Four took the suite
# from 890 to ~580 s, but two of six runs lost a kill -9 recovery test to Tansu's handling of a dead producer's
# transaction (tests/conftest.py); none of five runs at two did
# the broker tests run on Tansu and, with java and mvn present, on Apache Kafka (one per pytest process, reused:
# tests/conftest.py, docs/brokers.md); --broker tansu|apache after `pytest` keeps one of them
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --durations=25

bench: $(STAMP)
	$(BIN)/python bench/bench_engine.py
	$(BIN)/python bench/bench_castle.py
	$(BIN)/python bench/bench_end_to_end.py

clean-venv:
	rm -rf $(VENV)
