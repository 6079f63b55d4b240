# The README's two commands: `make demo` and `make test`.
# Both create .venv if missing and install the pinned stack first.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hmgraph-installed
DATA ?= data
DEMO_FLAGS ?= --dataset synth-small --root $(DATA) --epochs 8 --lr 0.01

.PHONY: demo test lint clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check \
		--constraint constraints.txt --editable '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	@mkdir -p $(DATA)
	$(BIN)/hmgraph train $(DEMO_FLAGS) --model sage --out runs/demo-sage \
		--features-on disk --cache hmgraph --device-budget 5% \
		--host-budget 20%
	$(BIN)/hmgraph train $(DEMO_FLAGS) --model mlp --out runs/demo-mlp
	@$(BIN)/python -m hmgraph.report runs/demo-sage/result.json \
		runs/demo-mlp/result.json

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf runs .pytest_cache
