"""Throwaway X.509 certificates made with the ``openssl`` CLI for the TLS/mTLS tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)


class Pki:
    """A CA in ``d`` that signs server and client certificates (``<name>.pem`` / ``<name>.key``)."""

    def __init__(self, d: Path) -> None:
        self.d = d
        openssl(d, "req", "-x509", *_KEY, "-days", "2", "-keyout", "ca.key", "-out", "ca.pem",
                "-subj", "/CN=edgewise-test-ca")
        (d / "ca.cnf").write_text("[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\nnew_certs_dir=.\n"
                                  "serial=serial\ndefault_md=sha256\npolicy=p\nunique_subject=no\n"
                                  "[p]\ncommonName=supplied\n")
        (d / "index.txt").write_text("")
        (d / "serial").write_text("01\n")

    def path(self, name: str) -> str:
        return str(self.d / name)

    def issue(self, name: str, cn: str, san: str = "", start: str = "", end: str = "") -> None:
        """``<name>.pem``/``.key`` signed by the CA; ``start``/``end`` as YYYYMMDDHHMMSSZ
        (default: valid from now for a day)."""
        openssl(self.d, "req", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        ext = ["-extfile", f"{name}.ext"] if san else []
        if san:
            (self.d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        dates = ["-startdate", start or "20000101000000Z", "-enddate", end] if end else ["-days", "1"]
        openssl(self.d, "ca", "-batch", "-config", "ca.cnf", "-keyfile", "ca.key", "-cert", "ca.pem",
                "-notext", "-in", f"{name}.csr", "-out", f"{name}.pem", *dates, *ext)

    def self_signed(self, name: str, cn: str) -> None:
        openssl(self.d, "req", "-x509", *_KEY, "-days", "1", "-keyout", f"{name}.key", "-out", f"{name}.pem",
                "-subj", f"/CN={cn}")

    def server(self) -> None:
        self.issue("server", "server", "DNS:localhost,IP:127.0.0.1")

    def read(self, name: str) -> tuple[bytes, bytes]:
        """(key, certificate chain) of ``name``."""
        return (self.d / f"{name}.key").read_bytes(), (self.d / f"{name}.pem").read_bytes()
