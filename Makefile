# Two entry points for a fresh machine (Python 3.11 and Java 17):
#   make demo   - install into .venv and run the main job on a bundled store
#   make test   - install into .venv and run the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STORE ?= fixtures/dev-sample/store

.PHONY: demo test install clean

$(BIN)/rmqtool: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[spark,test]'
	touch $@

install: $(BIN)/rmqtool

demo: install
	$(BIN)/rmqtool info $(STORE)

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
