# translate: the two commands are `make train` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONFIG ?= configs/bible.yaml
TORCH_VERSION ?= 2.13.0

.PHONY: install transformers4 data train test test-all test-slow lint format bench tensorboard clean

$(BIN)/translate: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(BIN)/python -m pip install --quiet -e ".[dev,export,serve]"
	touch $(BIN)/translate

install: $(BIN)/translate  ## create .venv and install the project with its dev tools and the export and serve extras

$(VENV)/transformers4/.installed: $(BIN)/translate
	$(BIN)/python -m pip install --quiet --upgrade --no-deps --target $(VENV)/transformers4 \
		"transformers>=4.46,<5" "huggingface-hub>=0.34,<1" "tokenizers>=0.21,<0.23"
	$(BIN)/python -m pip install --quiet --upgrade --target $(VENV)/transformers4 "requests>=2.32"
	touch $@

transformers4: $(VENV)/transformers4/.installed  ## transformers 4 beside the venv, for the translation-pipeline test (version 5 removed the pipeline)

data: install  ## fetch, clean and encode the corpus of CONFIG
	$(BIN)/translate prepare --config $(CONFIG)

train: install  ## prepare, train CONFIG (continuing an earlier run), then score the test split
	$(BIN)/translate train --config $(CONFIG) --resume
	run=$$($(BIN)/python scripts/run_dir.py $(CONFIG)) && $(BIN)/translate evaluate $$run/checkpoints/best.pt \
		--src $$run/data/test.en --ref $$run/data/test.fr --output $$run/test.hyp.fr --json $$run/test_scores.json

test: install  ## the fast test suite (4 to 6 minutes on 2 cores, by the CPU; the slow ones: make test-slow)
	$(BIN)/python -m pytest -m "not slow"

test-all: install  ## every test, the slow ones too
	$(BIN)/python -m pytest

test-slow: install  ## only the tests marked slow (the long end-to-end ones; CI runs them after make test)
	$(BIN)/python -m pytest -m slow

lint: install  ## ruff lint and format check
	$(BIN)/ruff check translate tests scripts
	$(BIN)/ruff format --check translate tests scripts

format: install
	$(BIN)/ruff format translate tests scripts
	$(BIN)/ruff check --fix translate tests scripts

bench: install  ## training and decoding benchmarks (see docs/performance.md); decoding needs CONFIG's best.pt (make train)
	$(BIN)/python scripts/bench_train.py --vs-reference
	ckpt=$$($(BIN)/python scripts/run_dir.py $(CONFIG))/checkpoints/best.pt && \
		{ test -f $$ckpt || { echo "make bench: the decoding benchmark needs $$ckpt: make train first" >&2; exit 2; }; } && \
		$(BIN)/python scripts/bench_decode.py $$ckpt --vs-nocache

tensorboard: install  ## TensorBoard on every run
	$(BIN)/tensorboard --logdir runs/

clean:  ## remove the virtualenv (.venv: the next make installs again) and tool caches; runs/ stays
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
