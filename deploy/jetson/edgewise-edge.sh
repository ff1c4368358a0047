#!/bin/sh
# Entry point of the edge daemon installed from the Debian package / rootfs overlay.
# The package's files are found from this script's own place (/usr/bin -> /usr/lib/edgewise-edge),
# so a tree installed under another root (dpkg --root, a rootfs) runs its own environment.
# No byte code is written next to the sources: dpkg could not remove it.
self=$(readlink -f "$0" 2>/dev/null || echo "$0")
LIB="${self%/bin/*}/lib/edgewise-edge"
export PYTHONDONTWRITEBYTECODE=1
if [ ! -x "$LIB/venv/bin/python3" ]; then  # an install whose setup.sh failed (the shell's "not found" said nothing)
  echo "edgewise-edge: error: $LIB/venv, the package's Python environment, is not built: $LIB/setup.sh" \
       "builds it (at install, or at boot by edgewise-edge-setup.service) and needs network or a bundle" \
       "built with --wheels; run sudo $LIB/setup.sh (it says what is missing), then this command again" >&2
  exit 2
fi
export PYTHONPATH="$LIB/python${PYTHONPATH:+:$PYTHONPATH}"
# The daemon reloads on SIGHUP; until Python holds it (edgewise/hangup.py) one would end the
# start, so it is ignored across the exec. Other commands keep the default: a closed terminal ends them.
case " $* " in *" edge run "*)
  if [ -e "$LIB/.setup-failed" ]; then  # setup.sh's last run failed (2: restarting cannot fix it)
    echo "edgewise-edge: error: the Python environment does not hold this version's pins: the last" \
         "$LIB/setup.sh failed (its output is in the journal, or dpkg's); run sudo $LIB/setup.sh," \
         "then sudo systemctl start edgewise-edge" >&2
    exit 2
  fi
  trap '' HUP ;;
esac
exec "$LIB/venv/bin/python3" -m edgewise "$@"
