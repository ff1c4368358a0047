#!/bin/sh
# Creates the edge daemon's Python environment, /usr/lib/edgewise-edge/venv, on top of
# JetPack's system packages (--system-site-packages: TensorRT's bindings and OpenCV with
# GStreamer come from JetPack), and installs requirements.txt at the exact versions of
# constraints-jetpack51.txt: from the bundled wheelhouse when the package carries one
# (built with --wheels: offline, e.g. a first boot without network), else from pip's
# configured package index. Idempotent; run by postinst and by edgewise-edge-setup.service.
#   --force   rebuild the environment even if it is complete
set -eu
LIB="${DPKG_ROOT:-}/usr/lib/edgewise-edge"
VENV="$LIB/venv"
WHEELS="${DPKG_ROOT:-}/usr/share/edgewise-edge/wheels"
[ "${1:-}" = "--force" ] && rm -f "$VENV/.complete"
[ -f "$VENV/.complete" ] && exit 0
rm -rf "$VENV"
python3 -m venv --system-site-packages "$VENV"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  set -- --no-index --find-links "$WHEELS"
  from="the bundled wheels in $WHEELS"
else
  set --
  from="the package index pip is configured with (/etc/pip.conf, PIP_INDEX_URL)"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check --no-cache-dir "$@"; }
# Ubuntu 20.04's venv pip (20.0) predates PEP 600 and cannot see manylinux_2_17 wheels
# (grpcio's): the pinned pip goes in first, then everything else.
if ! pip install -q "$@" -c "$LIB/constraints-jetpack51.txt" pip \
   || ! pip install -q "$@" -c "$LIB/constraints-jetpack51.txt" -r "$LIB/requirements.txt"; then
  echo "edgewise-edge: could not install the Python packages from $from (pip's error above);" \
       "without network, build the bundle with --wheels (deploy/jetson/README.md), then run" \
       "sudo /usr/lib/edgewise-edge/setup.sh" >&2
  exit 1
fi
# JetPack's cv2 and tensorrt were built against its numpy 1.17; they must import under the
# venv's numpy (constraints-jetpack51.txt says why they can).
"$VENV/bin/python" - <<'PY' || true
import importlib
for name in ("numpy", "onnxruntime", "cv2", "tensorrt"):
    try:
        mod = importlib.import_module(name)
        print("edgewise-edge: %s %s" % (name, getattr(mod, "__version__", "?")))
    except Exception as exc:
        print("edgewise-edge: %s not importable (%s)" % (name, exc))
PY
touch "$VENV/.complete"
