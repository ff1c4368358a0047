"""Checks of the gateway's TLS files at start, so a bad file is one clear line, not a failed bind.

gRPC's core reports a key that does not belong to its certificate only as "Failed
to bind to address"; ``load_server_files`` loads the pair with Python's ``ssl``
module first and names both files when they do not match or do not parse. It also
reads the server certificate's validity (RFC 5280 section 4.1.2.5, from the DER with a
minimal walk: no extra dependency) so the gateway can warn about an expired or
not-yet-valid certificate; clients enforce validity themselves, so the gateway
warns and serves rather than refusing to start (a fresh certificate and a node
whose clock is a little behind would otherwise crash-loop). The same checks decide whether
files that changed while the gateway runs are served (``cloud.gateway.tlsreload``).
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass

from edgewise.clienttls import NoPassphrase
from edgewise.errors import ConfigError
from edgewise.filereads import SMALL_FILE_BYTES, read_capped


@dataclass(frozen=True)
class ServerFiles:
    cert: bytes
    key: bytes
    client_ca: bytes | None
    not_before: dt.datetime
    not_after: dt.datetime

    def validity_problem(self, now: dt.datetime) -> str | None:
        """Why the certificate is not valid at ``now`` (UTC), or None."""
        if now < self.not_before:
            return f"is not valid before {self.not_before:%Y-%m-%d %H:%M:%S} UTC (clock skew?)"
        if now > self.not_after:
            return f"expired on {self.not_after:%Y-%m-%d %H:%M:%S} UTC; clients will refuse the handshake"
        return None


def load_server_files(cert_file: str, key_file: str, client_ca_file: str = "") -> ServerFiles:
    """Read and cross-check the server's PEM files; ConfigError naming the files otherwise."""
    try:
        cert = _read(cert_file, "tls.cert_file")
        key = _read(key_file, "tls.key_file")
        ca = _read(client_ca_file, "tls.client_ca_file") if client_ca_file else None
    except OSError as exc:
        raise ConfigError(f"tls: cannot read a certificate/key file: {exc}") from None
    asked = NoPassphrase()  # an encrypted key: never a prompt on the terminal, in gRPC's thread at a reload
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=asked)
    except ssl.SSLError as exc:
        why = ("the key is encrypted; the gateway has no passphrase setting: give it the key unencrypted, "
               "readable only by the gateway" if asked.asked
               else "the key does not belong to the certificate" if "KEY_VALUES_MISMATCH" in str(exc)
               else f"not a PEM certificate and private key ({exc.reason or exc})")
        raise ConfigError(f"tls: tls.cert_file {cert_file} and tls.key_file {key_file}: {why}") from None
    if ca is not None:
        try:
            # not create_default_context(cadata=...): an empty file (one an in-place write has just
            # emptied, an empty Secret key) is falsy there, loads the system's CAs instead and
            # passes, and gRPC then served mutual TLS trusting no device at all. A str, for PEM
            # (bytes are DER); ssl takes ASCII only (a TypeError else), and OpenSSL reads only the
            # PEM blocks: a non-ASCII byte becomes "?", ignored in a comment, refused in a block
            text = ca.decode("ascii", "replace").replace("\ufffd", "?")
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(f"tls: tls.client_ca_file {client_ca_file}: not a PEM CA bundle ({exc})") from None
    try:
        not_before, not_after = pem_validity(cert)
    except ValueError as exc:
        raise ConfigError(f"tls: tls.cert_file {cert_file}: cannot read its validity ({exc})") from None
    return ServerFiles(cert, key, ca, not_before, not_after)


def pem_validity(pem: bytes) -> tuple[dt.datetime, dt.datetime]:
    """(notBefore, notAfter) of the first certificate of a PEM file, wherever its block starts:
    OpenSSL and gRPC skip the text before it (the "Bag Attributes", "subject=" lines of
    ``openssl pkcs12 -nokeys``); ValueError when there is none to read."""
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    text = pem.decode("ascii", "replace")
    start = text.find(begin)
    stop = text.find(end, start) if start >= 0 else -1
    if stop < 0:
        raise ValueError(f"no {begin} ... {end} block")
    try:
        return validity(ssl.PEM_cert_to_DER_cert(text[start:stop + len(end)] + "\n"))
    except IndexError as exc:  # a block whose DER ends early
        raise ValueError(f"not a DER certificate ({exc})") from None


def _read(path: str, setting: str) -> bytes:
    """The bytes of one PEM file: a regular file of at most ``SMALL_FILE_BYTES``. A named pipe put
    in its place blocked the read (and OpenSSL's after it) for ever: at a reload, in the gRPC
    thread asking for the certificate, and no new connection was served again, nor did the
    gateway stop; ``/dev/zero`` filled the memory."""
    try:
        data, size = read_capped(path, SMALL_FILE_BYTES, "a PEM file")
    except ConfigError as exc:
        raise ConfigError(f"tls: {setting} {exc}") from None
    if size > SMALL_FILE_BYTES:
        raise ConfigError(f"tls: {setting} {path}: holds more than {SMALL_FILE_BYTES} bytes; is this the right file?")
    return data


def validity(der: bytes) -> tuple[dt.datetime, dt.datetime]:
    """(notBefore, notAfter) of a DER certificate, as aware UTC datetimes."""
    _, cert, _ = _tlv(der, 0)           # Certificate ::= SEQUENCE
    _, i, _ = _tlv(der, cert)           # tbsCertificate ::= SEQUENCE
    tag, _, end = _tlv(der, i)
    if tag == 0xA0:                     # [0] EXPLICIT version
        i = end
    for _ in range(3):                  # serialNumber, signature, issuer
        i = _tlv(der, i)[2]
    tag, start, _ = _tlv(der, i)        # validity ::= SEQUENCE { notBefore, notAfter }
    if tag != 0x30:
        raise ValueError("no validity field where RFC 5280 puts it")
    t1, s1, e1 = _tlv(der, start)
    t2, s2, e2 = _tlv(der, e1)
    return _time(t1, der[s1:e1]), _time(t2, der[s2:e2])


def _tlv(der: bytes, i: int) -> tuple[int, int, int]:
    """(tag, value start, value end) of the DER element at ``i`` (X.690 section 8.1)."""
    tag, n = der[i], der[i + 1]
    i += 2
    if n & 0x80:
        k = n & 0x7F
        n = int.from_bytes(der[i:i + k], "big")
        i += k
    if i + n > len(der):
        raise ValueError("truncated DER")
    return tag, i, i + n


def _time(tag: int, raw: bytes) -> dt.datetime:
    """UTCTime (YYMMDDHHMMSSZ, years 1950-2049) or GeneralizedTime (YYYYMMDDHHMMSSZ)."""
    text = raw.decode("ascii")
    if tag == 0x17:
        year, rest = int(text[:2]), text[2:]
        year += 1900 if year >= 50 else 2000
    elif tag == 0x18:
        year, rest = int(text[:4]), text[4:]
    else:
        raise ValueError(f"unexpected time tag {tag:#x}")
    return dt.datetime(year, int(rest[0:2]), int(rest[2:4]), int(rest[4:6]), int(rest[6:8]), int(rest[8:10]),
                       tzinfo=dt.timezone.utc)
