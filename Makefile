# bayesurl: two commands on a fresh machine (see README "Quick start").
#   make run    create .venv, install torch + bayesurl (+ FashionMNIST when apt works), run the main job
#   make test   run the test suite (creates .venv first when needed)
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# the exact versions CI tests; pyproject.toml declares the ranges a user may have
CONSTRAINTS := constraints.txt
EXTRAS ?= all,dev,docs
# the main job: frozen ImageNet EfficientNet-Lite0 features (extracted once into
# runs/features, reused by later runs); `make run PRESET=quick` trains the small conv net
# from scratch instead
PRESET ?= pretrained_quick
MAIN_OUT ?= runs/benchmark
MAIN_ARGS ?= --preset $(PRESET) --out $(MAIN_OUT)

.PHONY: run test install constraints data mathjax lint docs clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c $(CONSTRAINTS) torch torchvision
	$(PIP) install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed

# pin what the venv holds now (after an upgrade inside the ranges of pyproject.toml)
constraints: install
	{ sed -n '/^#/p' $(CONSTRAINTS); $(PIP) freeze --exclude-editable | grep -v '^#'; } \
	  > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)

# FashionMNIST from Debian when apt is usable; otherwise the bundled scikit-learn digits are used.
# Open Clip Art (the `clipart` data set) from Debian likewise; without it `--dataset clipart`
# says how to install it.
data:
	@if [ -d /usr/share/datasets/fashion-mnist ]; then echo "FashionMNIST present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) \
	  || echo "apt-get failed: falling back to scikit-learn digits"; \
	else echo "apt not usable: falling back to scikit-learn digits"; fi
	@if [ -d /usr/share/openclipart/png ]; then echo "Open Clip Art present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && apt-get install -y -qq openclipart-png) \
	  || echo "apt-get failed: no clipart (sudo apt-get install -y openclipart-png)"; \
	else echo "apt not usable: no clipart (sudo apt-get install -y openclipart-png)"; fi

# the benchmark writes its page from the runs in memory; `bayesurl report` then rebuilds the
# data from disk once to draw each query's thumbnails and neighbours into the same page
run: install data
	$(VENV)/bin/bayesurl benchmark $(MAIN_ARGS)
	$(VENV)/bin/bayesurl report $(MAIN_OUT)

# random test order (pytest-randomly) with the seed printed; rerun one order with
# `make test RANDOMLY_SEED=<seed>`
ifeq ($(origin RANDOMLY_SEED), undefined)
RANDOMLY_SEED := $(shell $(PYTHON) -c 'import random; print(random.randrange(2**32))')
endif

test: install
	@echo "pytest-randomly seed: $(RANDOMLY_SEED)"
	$(PY) -m pytest -q -n 2 --dist loadfile -p randomly --randomly-seed=$(RANDOMLY_SEED)

lint: install
	$(VENV)/bin/ruff check bayesurl tests benchmarks examples tools

# MathJax for offline formulas (docs/conf.py copies it into the built site); without it the
# pages load MathJax from its CDN.
mathjax:
	@if [ -f /usr/share/javascript/mathjax/MathJax.js ]; then echo "MathJax present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && apt-get install -y -qq libjs-mathjax) \
	  || echo "apt-get failed: formulas will need internet"; \
	else echo "apt not usable: formulas will need internet (or set BAYESURL_MATHJAX)"; fi

docs: install mathjax
	$(MAKE) -C docs html SPHINXBUILD=$(abspath $(VENV))/bin/sphinx-build

clean:
	rm -rf $(VENV) docs/_build runs
