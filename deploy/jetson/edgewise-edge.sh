#!/bin/sh
# Entry point of the edge daemon installed from the Debian package / rootfs overlay.
# The package's files are found from this script's own place (/usr/bin -> /usr/lib/edgewise-edge),
# so a tree installed under another root (dpkg --root, a rootfs) runs its own environment.
# No byte code is written next to the sources: dpkg could not remove it.
self=$(readlink -f "$0" 2>/dev/null || echo "$0")
LIB="${self%/bin/*}/lib/edgewise-edge"
export PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$LIB/python${PYTHONPATH:+:$PYTHONPATH}"
# The daemon reloads on SIGHUP; until Python holds it (edgewise/hangup.py) one would end the
# start, so it is ignored across the exec. Other commands keep the default: a closed terminal ends them.
case " $* " in *" edge run "*) trap '' HUP ;; esac
exec "$LIB/venv/bin/python3" -m edgewise "$@"
