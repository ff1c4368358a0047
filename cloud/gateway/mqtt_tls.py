"""The MQTT bridge's TLS files, followed without a restart.

paho's ``tls_set`` reads the bridge's CA bundle, client certificate and key once, and paho uses
that context for every reconnect: a client certificate that cert-manager renewed, or a broker
CA bundle rotated in the Secret, was used only after the gateway restarted, and once the old
client certificate expired the broker refused the bridge and MQTT escalations stopped.

:class:`BridgeTls` looks at the files before each connection attempt (paho's
``on_pre_connect``, called by ``cloud.gateway.mqtt_bridge.MqttBridge``) with the rule of the
gateway's own TLS files (``edgewise.filewatch.ReloadDecision`` over
``edgewise.filereads.file_identity``), and when they changed loads them into a new context that
wraps the connections from then on (``edgewise.clienttls.FollowedContext``). Files that cannot be
loaded are one ERROR per change naming them; the files in force stay. The context and the
followed one are built by the code the edge's MQTT transport uses (``edgewise.clienttls``).
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cloud.gateway.tlsfiles import pem_validity
from edgewise.clienttls import FollowedContext, client_context
from edgewise.errors import ConfigError
from edgewise.filewatch import Identities, ReloadDecision, identities_of
from edgewise.observability import LogThrottle

log = logging.getLogger("edgewise.gateway.mqtt")


@dataclass(frozen=True)
class ClientTls:
    """The bridge's TLS files, loaded: the context that wraps its connections, and the client
    certificate's validity (None: no client certificate, or its dates not read)."""

    context: ssl.SSLContext
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None


def load_client_tls(ca_file: str, cert_file: str, key_file: str) -> ClientTls:
    """A client context as paho's ``tls_set(ca_certs, certfile, keyfile)`` builds it
    (``edgewise.clienttls.client_context``: the broker's certificate verified against ``ca_file``,
    empty: the system's CAs, and its name checked against ``mqtt.host``; the client certificate of
    ``cert_file`` and ``key_file``, empty: the key is in ``cert_file``, for mutual TLS), and the
    client certificate's validity. A ``ConfigError`` naming the files otherwise."""
    try:
        ctx = client_context(ca_file, cert_file, key_file, BridgeTls.SETTINGS)
        not_before, not_after = _validity(Path(cert_file).read_bytes()) if cert_file else (None, None)
    except ConfigError as exc:
        raise ConfigError(f"mqtt: {exc}") from None
    except OSError as exc:
        pair = f"mqtt.cert_file {cert_file}" + (f" and mqtt.key_file {key_file}" if key_file else "")
        raise ConfigError(f"mqtt: {pair}: cannot be read ({exc.strerror or exc})") from None
    return ClientTls(ctx, not_before, not_after)


def _validity(pem: bytes) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(notBefore, notAfter) of the first certificate of a PEM file, for the log; (None, None) when
    it cannot be read (the context took the file: this is no check)."""
    try:
        return pem_validity(pem)
    except ValueError:
        return None, None


class BridgeTls:
    """The bridge's TLS files, followed. Built at start, where files that cannot be loaded are a
    ``ConfigError`` naming them (the gateway does not start); ``context`` goes to paho, and
    :meth:`look` runs before each connection attempt (paho's network thread)."""

    SETTINGS = ("mqtt.ca_file", "mqtt.cert_file", "mqtt.key_file")

    def __init__(self, ca_file: str, cert_file: str, key_file: str,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> None:
        self.paths = (ca_file, cert_file, key_file)
        self._clock = clock
        self._wall = wall
        self._bug_log = LogThrottle(60.0)
        seen = self.identities()  # before the read: files written meanwhile differ at the first look
        loaded = self.load()
        self._warn_validity(loaded)
        self.context = FollowedContext.following(loaded.context)
        # every connection attempt looks (paho's backoff spaces them at least a second apart)
        self.decision: ReloadDecision[ClientTls] = ReloadDecision(seen, clock(), interval_s=0.0)

    def identities(self) -> Identities:
        return identities_of(self.paths)

    def load(self) -> ClientTls:
        return load_client_tls(*self.paths)

    def look(self) -> None:
        """Before a connection attempt: when the files changed, put them in force for it and the
        next ones, or say once per change why not. Never raises (paho would end its network thread)."""
        try:
            out = self.decision.look(self._clock(), self.identities, self.load)
            named = ", ".join(f"{self.SETTINGS[i]} {self.paths[i]}" for i in out.changed if self.paths[i])
            if out.problem is not None:
                log.error("MQTT bridge TLS files changed (%s) but were not put in force: the bridge connects "
                          "with the files it had; %s: %s", named, self.decision.when_again, out.problem)
            if out.files is None:
                return
            self._warn_validity(out.files)
            self.context.current = out.files.context
            until = (f" (client certificate valid until {out.files.not_after:%Y-%m-%d %H:%M:%S} UTC)"
                     if out.files.not_after is not None else "")
            log.info("MQTT bridge TLS files changed: the bridge connects with the new files from now on%s; "
                     "changed: %s", until, named)
        except Exception:
            held = self._bug_log.allow()
            if held is not None:
                log.exception("looking at the MQTT bridge's TLS files failed; the bridge connects with the files "
                              "it had%s", f" ({held} more failures not logged)" if held else "")

    def _warn_validity(self, loaded: ClientTls) -> None:
        now = self._wall()
        if loaded.not_before is not None and now < loaded.not_before:
            log.warning("mqtt.cert_file %s is not valid before %s UTC (clock skew?): the broker may refuse the "
                        "bridge", self.paths[1], f"{loaded.not_before:%Y-%m-%d %H:%M:%S}")
        elif loaded.not_after is not None and now > loaded.not_after:
            log.warning("mqtt.cert_file %s expired on %s UTC: the broker refuses the bridge; renew it (the bridge "
                        "reads it again when it changes)", self.paths[1], f"{loaded.not_after:%Y-%m-%d %H:%M:%S}")
