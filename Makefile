# Two entry points for a fresh machine (Python 3.11 and Java 17):
#   make demo   - install into .venv and run the main job (Spark export + stats) on a bundled store
#   make test   - install into .venv and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= fixtures/dev-config-5x/store

.PHONY: demo test install man clean

$(BIN)/rmqtool: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# compat: a path entry, so PySpark's look-up of installed pyspark_* modules finds the rocketmq source
	# (setuptools' boxed notice that the compat mode is transitional is silenced: the mode is chosen)
	PYTHONWARNINGS='ignore:Compat editable installs' \
	    $(BIN)/python -m pip install --quiet -e '.[spark,test]' --config-settings editable_mode=compat
	touch $@

install: $(BIN)/rmqtool

# The main job: a Spark export of a bundled 5.3.3 broker's store to Parquet, then per-topic statistics on
# Spark (both in an embedded local[*] session), then the store summary. README.md shows what it prints.
demo: install
	rm -rf build/demo
	$(BIN)/rmqtool export $(STORE) --to build/demo/messages --engine spark
	$(BIN)/rmqtool stats $(STORE) --by topic --engine spark --format plain --fields topic,messages,bytes,queue_type
	$(BIN)/rmqtool info $(STORE) --format plain --fields store,messages,topics,max_store_timestamp,abort,lock

# The suite in a process per core (at most 4), each test module's tests in one process; the slowest tests
# listed, to keep the run well under 30 minutes.
test: install
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=25

man: install   # regenerate the committed man pages after changing the CLI
	$(BIN)/python -m rmqtool._manpages man/

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build
