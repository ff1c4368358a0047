#!/bin/sh
# Entry point of the edge daemon installed from the Debian package / rootfs overlay.
export PYTHONPATH=/usr/lib/edgewise-edge/python${PYTHONPATH:+:$PYTHONPATH}
exec /usr/lib/edgewise-edge/venv/bin/python3 -m edgewise "$@"
