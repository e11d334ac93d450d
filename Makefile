# Two entry points for a fresh machine (Python 3.11 and Java 17):
#   make demo   - install into .venv and run the main job (Spark export + stats) on a bundled store
#   make test   - install into .venv and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= fixtures/dev-sample/store

.PHONY: demo test install man clean

$(BIN)/rmqtool: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# compat: a path entry, so PySpark's look-up of installed pyspark_* modules finds the rocketmq source
	$(BIN)/python -m pip install --quiet -e '.[spark,test]' --config-settings editable_mode=compat
	touch $@

install: $(BIN)/rmqtool

# The main job: a Spark export of the bundled store to Parquet, then per-topic statistics on Spark
# (both in an embedded local[*] session), then the store summary. The three commands run in one process:
# the Spark jobs share one session (starting one takes seconds, most of the demo's time).
DEMO = export $(STORE) --to build/demo/messages --engine spark; \
       stats $(STORE) --by topic --engine spark --format plain; \
       info $(STORE) --format plain
demo: install
	rm -rf build/demo
	$(BIN)/python -c 'import sys; from rmqtool.cli import cli; \
	  sys.exit(max(cli.main(c.split(), "rmqtool", standalone_mode=False) or 0 for c in sys.argv[1].split(";")))' \
	  '$(DEMO)'

test: install
	$(BIN)/python -m pytest -q

man: install   # regenerate the committed man pages after changing the CLI
	$(BIN)/python -m rmqtool._manpages man/

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build
