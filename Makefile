# Two entry points for a fresh machine: `make demo` (train + translate + BLEU) and `make test`;
# `make vit` trains the Vision Transformer on Fashion-MNIST (30 min) and prints test accuracy.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export QKV_DATA_DIR ?= $(abspath ../shared/data)
RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: demo vit test venv clean

$(BIN)/qkv: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch pinned first: on our machines this takes the local CPU wheel.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(BIN)/qkv

venv: $(BIN)/qkv

demo: venv
	$(BIN)/qkv train translation --out $(RUN)

vit: venv
	$(BIN)/qkv train vit --out $(subst demo-,vit-,$(RUN))

test: venv
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs .pytest_cache
