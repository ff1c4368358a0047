#!/bin/sh
# Creates the edge daemon's Python environment, /usr/lib/edgewise-edge/venv, on top of
# JetPack's system packages (--system-site-packages: TensorRT's bindings and OpenCV with
# GStreamer come from JetPack), and installs requirements.txt at the exact versions of
# constraints-jetpack51.txt: from the bundled wheelhouse when the package carries one
# (built with --wheels: offline, e.g. a first boot without network), else from pip's
# configured package index. Run by postinst (every install and upgrade) and by
# edgewise-edge-setup.service (every boot, before the daemon).
#
# venv/.complete holds the sha256 of requirements.txt, constraints-jetpack51.txt and python3's
# version the environment was built from. While they match, this does nothing. When they
# differ (an upgrade with new pins, a new python3) a new environment is built beside the
# current one (venv.new) and swapped in only once complete: a failed build (no network, a
# wheel missing) leaves the current environment as it was and exits 1, and a swap cut short
# (a power loss) is finished by the next run.
# $LIB/.setup-failed is there from a failed run that leaves the environment without these pins
# (not a failed --force rebuild of a current one) until one succeeds: `edgewise-edge edge run`
# refuses to start on it (a daemon running when an upgrade's build failed would otherwise run
# the new sources on the old pins at its next restart).
#   --force   rebuild the environment even if it matches
set -eu
LIB="${DPKG_ROOT:-}/usr/lib/edgewise-edge"
VENV="$LIB/venv"
NEW="$LIB/venv.new"
WHEELS="${DPKG_ROOT:-}/usr/share/edgewise-edge/wheels"
# One run at a time: the boot unit and an upgrade (unattended-upgrades at boot) may overlap.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$LIB/.setup.lock"
  flock 9
fi
# A swap cut short (a power loss between its two renames, at the end) left no venv: the new
# environment (venv.new, complete once stamped) or else the one it replaced (venv.old) takes
# its place again, and the stamp check below decides as on any run; the daemon's unit starts
# only after this one's run at boot.
if [ ! -d "$VENV" ]; then
  for kept in "$NEW" "$VENV.old"; do
    if [ -x "$kept/bin/python3" ] && { [ "$kept" != "$NEW" ] || [ -f "$NEW/.complete" ]; }; then
      mv "$kept" "$VENV"
      echo "edgewise-edge: $VENV was missing (a swap cut short): put $kept back in its place"
      break
    fi
  done
fi
if [ -d "$VENV" ]; then rm -rf "$VENV.old"; fi  # what a swap cut short after its renames left (190 MB)
# A failed --force rebuild leaves an environment that holds these pins: no note for that one.
current=
trap 'if [ $? -eq 0 ] || [ -n "$current" ]; then rm -f "$LIB/.setup-failed"; else : > "$LIB/.setup-failed"; fi' EXIT
want=$(python3 - "$LIB/requirements.txt" "$LIB/constraints-jetpack51.txt" <<'PY'
import hashlib, platform, sys
h = hashlib.sha256()
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        h.update(f.read())
h.update(("python " + platform.python_version()).encode())
print(h.hexdigest())
PY
)
have=$(head -n 1 "$VENV/.complete" 2>/dev/null || true)
if [ "$have" = "$want" ] && [ -x "$VENV/bin/python3" ]; then
  current=yes
  [ "${1:-}" = "--force" ] || exit 0
fi
if [ -d "$VENV" ] && [ "${1:-}" != "--force" ]; then
  echo "edgewise-edge: the Python environment was built from other pins or another python3; building a new one"
else
  echo "edgewise-edge: building the Python environment in $VENV"
fi
rm -rf "$NEW"
python3 -m venv --system-site-packages --prompt venv "$NEW"
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  set -- --no-index --find-links "$WHEELS"
  from="the bundled wheels in $WHEELS"
else
  set --
  from="the package index pip is configured with (/etc/pip.conf, PIP_INDEX_URL)"
fi
pip() { "$NEW/bin/python" -m pip --disable-pip-version-check --no-cache-dir "$@"; }
# Ubuntu 20.04's venv pip (20.0) predates PEP 600 and cannot see manylinux_2_17 wheels
# (grpcio's): the pinned pip goes in first, then everything else.
if ! pip install -q "$@" -c "$LIB/constraints-jetpack51.txt" pip \
   || ! pip install -q "$@" -c "$LIB/constraints-jetpack51.txt" -r "$LIB/requirements.txt"; then
  rm -rf "$NEW"
  kept="there is no environment yet"
  [ -d "$VENV" ] && kept="the current environment is left as it was (the previous pins)"
  [ -n "$current" ] && kept="the current environment, which holds these pins, is left as it was and the daemon still starts on it"
  echo "edgewise-edge: could not install the Python packages from $from (pip's error above);" \
       "$kept. Without network, build the bundle with --wheels (deploy/jetson/README.md), then run" \
       "sudo /usr/lib/edgewise-edge/setup.sh" >&2
  exit 1
fi
# JetPack's cv2 and tensorrt were built against its numpy 1.17; they must import under the
# venv's numpy (constraints-jetpack51.txt says why they can). One JetPack does not have
# installed is named with what installs it (edgewise/systemdeps.py, as every command does).
"$NEW/bin/python" - "$LIB/python" <<'PY' || true
import importlib, sys
sys.path.insert(0, sys.argv[1])
try:
    from edgewise.systemdeps import missing_module_error
except ImportError:  # the package's modules are not there (a bare setup.sh)
    def missing_module_error(exc):
        return None
for name in ("numpy", "onnxruntime", "cv2", "tensorrt"):
    try:
        mod = importlib.import_module(name)
        print("edgewise-edge: %s %s" % (name, getattr(mod, "__version__", "?")))
    except Exception as exc:
        hint = missing_module_error(exc)
        print("edgewise-edge: %s" % hint if hint else "edgewise-edge: %s not importable (%s)" % (name, exc))
PY
# The daemon runs `venv/bin/python3 -m edgewise`, which does not care where the environment
# was built; the scripts pip wrote (bin/pip...) name venv.new: they name venv before the swap.
for f in "$NEW"/bin/*; do
  if [ -f "$f" ] && [ ! -L "$f" ] && grep -qF "$NEW" "$f"; then sed -i "s|$NEW|$VENV|g" "$f"; fi
done
echo "$want" > "$NEW/.complete"  # complete: what the start of a run puts back after a cut-short swap
# Swap (two renames: between them there is no venv, which the start of the next run repairs)
current=  # from here the current environment is being replaced
rm -rf "$VENV.old"
if [ -d "$VENV" ]; then mv "$VENV" "$VENV.old"; fi
mv "$NEW" "$VENV"
rm -rf "$VENV.old"
