"""The device's TLS files checked before they are used: CA bundle, client certificate, key.

A missing file, a file that is not what its setting says, or a key that does not belong
to the certificate makes every escalation fail (gRPC: "Failed to create security
handshaker", spooled forever; MQTT: a traceback at start). They are configuration
errors, found by ``edgewise edge run`` and ``check-config`` before anything starts, and by
``edgewise edge provision`` before anything is written. A certificate outside its
validity period, or one that does not name the device, is a warning only: a device whose
clock has not been set yet (a Jetson before NTP) would otherwise refuse to run its edge
detection at all, and which certificate field the gateway reads is the gateway's setting.

Only the standard ``ssl`` module is used (the Jetson bundle adds no crypto library).
"""

from __future__ import annotations

import ssl
import time
from typing import Any, Dict, List, Optional

from edgewise.clienttls import regular_pem
from edgewise.errors import ConfigError


def _context() -> ssl.SSLContext:
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def _why(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    if isinstance(exc, IsADirectoryError):
        return "is a folder"
    if isinstance(exc, PermissionError):
        return "permission denied"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def check_ca(path: str, setting: str) -> None:
    """``path`` holds at least one PEM certificate; ConfigError naming ``setting`` otherwise."""
    try:
        regular_pem(path, setting)
        _context().load_verify_locations(cafile=path)
    except ConfigError:  # not a regular file: said as such
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{setting} {path}: cannot be used as a CA bundle ({_why(exc)}); give the PEM file "
                          "of the CA that signed the gateway's certificate") from None


def _no_password() -> bytes:
    raise ConfigError("the key is encrypted")


def check_pair(cert: str, key: str, cert_setting: str, key_setting: str) -> None:
    """The certificate and key load and belong together; ConfigError naming the settings."""
    for path, setting in ((cert, cert_setting), (key, key_setting)):
        try:
            regular_pem(path, setting)
        except OSError as exc:
            raise ConfigError(f"{setting} {path}: {_why(exc)}") from None
    try:
        _context().load_cert_chain(cert, key, password=_no_password)
    except ConfigError:
        raise ConfigError(f"{key_setting} {key}: the key is encrypted; the daemon needs it unencrypted, readable "
                          "only by its group (edgewise edge provision sets mode 0640)") from None
    except (ssl.SSLError, ValueError, OSError) as exc:
        why = _why(exc)
        if "KEY_VALUES_MISMATCH" in why.upper():
            raise ConfigError(f"{key_setting} {key}: is not the key of {cert_setting} {cert}; give the key the "
                              "certificate was issued for") from None
        raise ConfigError(f"{cert_setting} {cert} / {key_setting} {key}: cannot be used as a client certificate "
                          f"and key ({why}); give PEM files") from None


def certificate_warnings(cert: str, device_id: str, now: Optional[float] = None) -> List[str]:
    """What is likely wrong with a loadable certificate: outside its validity period, or
    not naming ``device_id`` in its common name or subject alternative names."""
    try:
        info: Dict[str, Any] = ssl._ssl._test_decode_cert(cert)  # type: ignore[attr-defined]
    except (AttributeError, ssl.SSLError, OSError, ValueError):
        return []  # an interpreter without the decoder: the handshake will say what is wrong
    out: List[str] = []
    t = time.time() if now is None else now
    start: Optional[int] = None
    end: Optional[int] = None
    try:
        start, end = ssl.cert_time_to_seconds(info["notBefore"]), ssl.cert_time_to_seconds(info["notAfter"])
    except (KeyError, ValueError):
        pass
    if end is not None and t > end:
        out.append(f"{cert}: the certificate expired on {info['notAfter']}; the gateway will refuse this device "
                   "until it has a new one")
    elif start is not None and t < start:
        out.append(f"{cert}: the certificate is valid only from {info['notBefore']}: is this device's clock "
                   f"right ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(t))})?")
    names = [v for rdn in info.get("subject", ()) for k, v in rdn if k == "commonName"]
    names += [v for _, v in info.get("subjectAltName", ())]
    if device_id and names and not any(device_id in n for n in names):
        out.append(f"{cert}: the certificate names {', '.join(names[:3])}, not the device id {device_id!r}; a "
                   "gateway that checks client certificates will refuse it")
    return out


def check_files(ca: str, cert: str, key: str, device_id: str, prefix: str = "cloud.") -> List[str]:
    """Check whichever of the three files are set; return the warnings (see the module doc)."""
    if ca:
        check_ca(ca, prefix + "tls_ca")
    if cert and key:
        check_pair(cert, key, prefix + "tls_cert", prefix + "tls_key")
        return certificate_warnings(cert, device_id)
    return []
