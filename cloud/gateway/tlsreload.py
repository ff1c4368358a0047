"""Serving a renewed certificate, and a rotated client CA bundle, without a restart.

The gateway used to load ``tls.cert_file``, ``tls.key_file`` and ``tls.client_ca_file`` once at
start. cert-manager renews a certificate's Secret (a 90-day certificate at 60 days) and kubelet
swaps the mounted files, certbot rewrites its files, an operator rotates the devices' CA bundle;
the gateway kept serving what it had read at start until a restart, and once that certificate
expired every edge's handshake failed.

The gateway now serves with ``grpc.dynamic_ssl_server_credentials``: gRPC's core asks
:meth:`ServedTlsFiles.fetch` before every new connection's handshake whether to use a new
configuration. It looks at the three files at most once every :data:`RECHECK_S` seconds (a storm
of new connections costs one ``stat`` per file per second, not one per connection), with
:func:`edgewise.filereads.file_identity`, the project's one rule of "did a file change" (resolved
path, inode, size, times: a kubelet ``..data`` swap, a file rewritten in place or moved over).
When one changed, the files are read through :func:`cloud.gateway.tlsfiles.load_server_files`,
the checks of the start (the key belongs to the certificate, each file parses), and:

* they pass: new connections get the new certificate and client CA (connections already open
  keep theirs), logged as ``TLS files changed: serving the new certificate`` with its end of
  validity; an expired or not yet valid certificate is warned about as at start and served,
  as a restart would serve it;
* they do not (a certificate written before its key, as certbot-style in-place writes do;
  a file that does not parse or is gone): one ERROR per change naming the files and the
  problem, the current certificate stays, and they are read again when they change again
  (and, unchanged, once a minute: a read error that passes does not hold a renewal back);
* they changed while they were read (the identities after the read differ from before): what
  was read may be half old, half new, so nothing is put in force and they are read again at
  the next look.

Mutual TLS stays on across reloads (``require_client_authentication`` belongs to the
credentials, not to a configuration), and a client CA bundle rotated into place is the one new
connections' certificates are checked against.

``edgewise.filewatch.ReloadDecision`` is the decision, pure (a clock reading, a function giving
the files' identities and a loader are passed in), shared with the gateway's MQTT bridge
(``cloud.gateway.mqtt_tls``) and the edge's transports; :class:`ServedTlsFiles` is the shell:
the lock (gRPC calls ``fetch`` from its own threads; a connection arriving while another looks
keeps the current configuration rather than wait), the logging, and the guarantee that
``fetch`` never raises.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable

import grpc

from cloud.gateway.tlsfiles import ServerFiles, load_server_files
from edgewise.filewatch import Identities, ReloadDecision, identities_of
from edgewise.observability import LogThrottle

log = logging.getLogger("edgewise.gateway")

#: The TLS files are looked at, on a new connection, at most once per this many seconds: a
#: renewal is in force for new connections about a second after kubelet or certbot wrote it.
RECHECK_S = 1.0


def _config(files: ServerFiles) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], root_certificates=files.client_ca)


class ServedTlsFiles:
    """The gateway's server credentials, following its TLS files. Built at start, where a file
    that cannot be served is a ``ConfigError`` (as before); ``credentials`` goes to the port."""

    SETTINGS = ("tls.cert_file", "tls.key_file", "tls.client_ca_file")

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str, require_client_cert: bool,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> None:
        self.paths = (cert_file, key_file, client_ca_file)
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._bug_log = LogThrottle(60.0)
        seen = self.identities()  # before the read: files written meanwhile differ at the first look
        files = self.load()
        self._warn_validity(files)
        self.not_after = files.not_after  # of the certificate in force
        self.decision: ReloadDecision[ServerFiles] = ReloadDecision(seen, clock(), RECHECK_S)
        self.credentials = grpc.dynamic_ssl_server_credentials(
            _config(files), self.fetch, require_client_authentication=require_client_cert)

    def identities(self) -> Identities:
        return identities_of(self.paths)

    def load(self) -> ServerFiles:
        return load_server_files(*self.paths)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's core calls this before each new connection's handshake: a new configuration,
        or None to keep the current one. Cheap (see :data:`RECHECK_S`) and never raises."""
        if not self._lock.acquire(blocking=False):
            return None  # another connection is looking right now
        try:
            out = self.decision.look(self._clock(), self.identities, self.load)
            named = ", ".join(f"{self.SETTINGS[i]} {self.paths[i]}" for i in out.changed if self.paths[i])
            if out.problem is not None:
                log.error("TLS files changed (%s) "
                          "but were not put in force, the current certificate is still served; "
                          "%s: %s", named, self.decision.when_again, out.problem)
            if out.files is None:
                return None
            self._warn_validity(out.files)
            self.not_after = out.files.not_after
            log.info("TLS files changed: serving the new certificate (valid until %s UTC) to new connections; "
                     "changed: %s", f"{out.files.not_after:%Y-%m-%d %H:%M:%S}", named)
            return _config(out.files)
        except Exception:  # gRPC would log it for every connection; keep serving what is in force
            held = self._bug_log.allow()
            if held is not None:
                log.exception("looking at the TLS files failed; the current certificate is still served%s",
                              f" ({held} more failures not logged)" if held else "")
            return None
        finally:
            self._lock.release()

    def _warn_validity(self, files: ServerFiles) -> None:
        problem = files.validity_problem(self._wall())
        if problem:
            log.warning("tls.cert_file %s %s", self.paths[0], problem)
