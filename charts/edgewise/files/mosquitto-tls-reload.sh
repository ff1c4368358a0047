#!/bin/sh
# Sidecar of the chart's Mosquitto broker (templates/mosquitto.yaml). Mosquitto reads its TLS
# files at start and again on SIGHUP (Mosquitto 2.0 and later), nothing else: a certificate that
# cert-manager renews, or a client CA bundle rotated in the Secret, would be served only after
# a restart, and once the old certificate expires every edge's handshake fails. kubelet updates
# the mounted Secret by swapping its ..data link; this looks at the files every INTERVAL seconds
# (their resolved path, inode, size, modification and change times, whole seconds) and, when one
# changed, sends the broker SIGHUP through the pid file it writes (the pod shares one process
# namespace). Its first look also signals: it cannot know which files the broker read at start
# (a swap between the broker's read and that look would otherwise go unseen until the next one),
# and a reload of the same files does no harm.
# POSIX sh and busybox applets only (the broker's image is Alpine).
set -u
TLS_DIR=${TLS_DIR:-/mosquitto/tls}
PID_FILE=${PID_FILE:-/mosquitto/run/mosquitto.pid}
INTERVAL=${INTERVAL:-30}

look() {
  for f in "$TLS_DIR/tls.crt" "$TLS_DIR/tls.key" "$TLS_DIR/ca.crt"; do
    echo "$(readlink -f "$f" 2>/dev/null) $(stat -L -c '%i %s %Y %Z' "$f" 2>/dev/null)"
  done
}

last=first
echo "watching the TLS files in $TLS_DIR every $INTERVAL s"
while sleep "$INTERVAL"; do
  now=$(look)
  [ "$now" = "$last" ] && continue
  pid=$(cat "$PID_FILE" 2>/dev/null)
  if [ -n "$pid" ] && kill -HUP "$pid" 2>/dev/null; then
    if [ "$last" = first ]; then
      echo "first look at the TLS files in $TLS_DIR: sent SIGHUP to mosquitto (pid $pid), so it serves them as they are now"
    else
      echo "TLS files changed in $TLS_DIR: sent SIGHUP to mosquitto (pid $pid), which reloads its certificates for new connections"
    fi
    last=$now
  else
    echo "TLS files changed in $TLS_DIR, but mosquitto (pid file $PID_FILE) cannot be signalled yet; trying again in $INTERVAL s" >&2
  fi
done
