#!/bin/sh
# Creates the daemon's Python environment on top of JetPack's system packages
# (TensorRT bindings, numpy, OpenCV come from JetPack: --system-site-packages), and
# installs the pure-Python dependencies pinned in constraints-jetpack51.txt, from the
# bundled wheelhouse when the package carries one (offline install), else from the
# configured package index. Idempotent; run by postinst and by the first-boot unit.
set -eu
LIB=/usr/lib/edgewise-edge
VENV="$LIB/venv"
[ -f "$VENV/.complete" ] && exit 0
rm -rf "$VENV"
python3 -m venv --system-site-packages "$VENV"
if [ -d /usr/share/edgewise-edge/wheels ] && ls /usr/share/edgewise-edge/wheels/*.whl >/dev/null 2>&1; then
  "$VENV/bin/pip" install --no-index --find-links /usr/share/edgewise-edge/wheels \
    -c "$LIB/constraints-jetpack51.txt" -r "$LIB/requirements.txt"
else
  "$VENV/bin/pip" install -c "$LIB/constraints-jetpack51.txt" -r "$LIB/requirements.txt"
fi
touch "$VENV/.complete"
