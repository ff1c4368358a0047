"""The TLS client context both MQTT ends build (the edge's connection, ``edge.transports.mqtt``,
and the gateway's bridge, ``cloud.gateway.mqtt_tls``), and the context paho is given so that
renewed files are used without a restart.

paho's ``tls_set`` reads the CA bundle, client certificate and key once, and paho wraps every
reconnect with that context: a renewed client certificate or a rotated CA bundle was used only
after a restart. Each end instead gives paho a :class:`FollowedContext` (``tls_set_context``)
and, before each connection attempt (paho's ``on_pre_connect``, paho 2.0 and later), looks at
its files with ``edgewise.filewatch.ReloadDecision``; when they changed it loads them into a new
context (:func:`client_context`) that the followed one hands the connections to from then on.

Only the standard ``ssl`` module (the gateway's server files use :class:`NoPassphrase` too): no
paho import here (paho is installed only with the MQTT ends).
"""

from __future__ import annotations

import socket
import ssl
from typing import Optional, Tuple, Union

from edgewise.errors import ConfigError
from edgewise.filereads import read_capped


class NoPassphrase:
    """The ``password`` of a ``load_cert_chain``: an encrypted key is refused (there is no
    passphrase setting), never prompted for. Without it OpenSSL asks the terminal ("Enter PEM pass
    phrase:") and holds the thread that loads (paho's network thread, the gRPC thread asking the
    gateway for its certificate) until someone types; without a terminal the load fails with
    ``OSError: [Errno 22]``, not an ``ssl.SSLError``. ``asked``: the key was encrypted."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self) -> bytes:
        self.asked = True
        return b""


def regular_pem(path: str, setting: str) -> None:
    """``path`` (named by ``setting``) opens, without waiting, as a regular file
    (``edgewise.filereads``), else a ``ConfigError`` saying what it is. OpenSSL opens the PEM files
    it loads by their path and reads them to the end: a named pipe put in a file's place blocked
    that read for ever (paho's network thread, the edge's event loop, the gRPC thread of a
    gateway's handshake), ``/dev/zero`` filled the memory. ``OSError`` (not found, a folder,
    permission) is the caller's to word."""
    try:
        read_capped(path, 0, "a PEM file")
    except ConfigError as exc:
        raise ConfigError(f"{setting} {exc}") from None


def client_context(ca_file: str, cert_file: str, key_file: str,
                   settings: Tuple[str, str, str] = ("ca_file", "cert_file", "key_file")) -> ssl.SSLContext:
    """A client context as paho's ``tls_set(ca_certs, certfile, keyfile)`` builds it: TLS client
    (``PROTOCOL_TLS_CLIENT``), the server's certificate verified (``CERT_REQUIRED``) against
    ``ca_file`` (empty: the system's CAs) and its name checked (``check_hostname``); the client
    certificate of ``cert_file`` and ``key_file`` (empty: the key is in ``cert_file``) for mutual
    TLS. A ``ConfigError`` naming the files by their ``settings`` (CA, certificate, key) and the
    problem otherwise."""
    ca_setting, cert_setting, key_setting = settings
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.check_hostname = True
    if cert_file:
        pair = f"{cert_setting} {cert_file}" + (f" and {key_setting} {key_file}" if key_file else "")
        try:
            regular_pem(cert_file, cert_setting)
            if key_file:
                regular_pem(key_file, key_setting)
            ctx.load_cert_chain(cert_file, key_file or None, password=NoPassphrase())
        except ssl.SSLError as exc:
            why = ("the key does not belong to the certificate" if "KEY_VALUES_MISMATCH" in str(exc)
                   else f"not a PEM certificate and unencrypted private key ({exc.reason or exc})")
            raise ConfigError(f"{pair}: {why}") from None
        except OSError as exc:
            raise ConfigError(f"{pair}: cannot be read ({exc.strerror or exc})") from None
    try:
        if ca_file:
            regular_pem(ca_file, ca_setting)
            ctx.load_verify_locations(ca_file)
        else:
            ctx.load_default_certs()
    except ssl.SSLError as exc:
        raise ConfigError(f"{ca_setting} {ca_file}: not a PEM CA bundle ({exc.reason or exc})") from None
    except OSError as exc:
        raise ConfigError(f"{ca_setting} {ca_file}: cannot be read ({exc.strerror or exc})") from None
    return ctx


class FollowedContext(ssl.SSLContext):
    """The one context paho is given (``tls_set_context`` takes one for the client's life, and paho
    wraps each new connection with it): it hands each connection to the context of the files in
    force, ``current``, which the owner replaces when they change. A new context, not files
    loaded into this one: ``load_verify_locations`` only adds, so a CA removed from the bundle
    would stay trusted, and a pair that does not match, loaded into a context, leaves it with no
    client certificate at all (OpenSSL 3.0: the next handshake sent none). Its own
    ``check_hostname`` and ``verify_mode`` are those of every ``current`` (paho reads
    ``check_hostname`` to know that the context checks the server's name): :meth:`following`."""

    current: ssl.SSLContext

    @classmethod
    def following(cls, current: ssl.SSLContext) -> FollowedContext:
        """A followed context handing connections to ``current`` (one of :func:`client_context`)."""
        ctx = cls(ssl.PROTOCOL_TLS_CLIENT)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.check_hostname = True
        ctx.current = current
        return ctx

    def wrap_socket(self, sock: socket.socket, server_side: bool = False,
                    do_handshake_on_connect: bool = True, suppress_ragged_eofs: bool = True,
                    server_hostname: Optional[Union[str, bytes]] = None,
                    session: Optional[ssl.SSLSession] = None) -> ssl.SSLSocket:
        return self.current.wrap_socket(sock, server_side=server_side,
                                        do_handshake_on_connect=do_handshake_on_connect,
                                        suppress_ragged_eofs=suppress_ragged_eofs,
                                        server_hostname=server_hostname, session=session)
