"""The shell around the reload rule (``edgewise.filewatch.FollowedFiles``), on real files with a
fake clock: at most one look per interval, new files handed out once, files that cannot be used
reported once per change naming the setting, and a look that never raises. The rule itself
(``ReloadDecision``) is driven in tests/cloud/gateway/test_tls_reload.py."""

from __future__ import annotations

import logging
from pathlib import Path

from edgewise.errors import ConfigError
from edgewise.filewatch import FollowedFiles, identities_of
from tests.secretvolume import SecretVolume

LOG = logging.getLogger("tests.filewatch")


def loader(*paths: Path):
    """Reads the files; a file holding ``bad`` cannot be used."""
    def load() -> tuple:
        texts = tuple(p.read_text() for p in paths)
        for p, text in zip(paths, texts):
            if text == "bad":
                raise ConfigError(f"{p}: bad")
        return texts
    return load


def messages(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOG.name and r.levelno == level]


def test_followed_files_hand_out_new_files_once_and_report_a_refusal_once_per_change(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=LOG.name)
    a, b = tmp_path / "a.pem", tmp_path / "b.key"
    a.write_text("a1")
    b.write_text("b1")
    now = [0.0]
    f = FollowedFiles((str(a), str(b), ""), ("x.cert", "x.key", "x.ca"), loader(a, b), "the client", LOG,
                      clock=lambda: now[0], interval_s=1.0)
    assert f.loaded == ("a1", "b1")
    assert identities_of((str(a), "")) == (f.decision.served[0], None)

    b.write_text("bad")  # the key written before... something that cannot be used
    assert f.look() is None  # no look due: within a second of the start
    for t in (1.0, 2.0, 3.0):
        now[0] = t
        assert f.look() is None
    (error,) = messages(caplog, logging.ERROR)
    assert error == (f"TLS files changed (x.key {b}) but were not put in force: the client connects with the "
                     f"files it had; they are read again when they change, and tried again every 60 s: {b}: bad")
    assert f.loaded == ("a1", "b1")

    a.write_text("a2")
    b.write_text("b2")
    now[0] = 4.0
    assert f.look() == ("a2", "b2") and f.loaded == ("a2", "b2")
    now[0] = 5.0
    assert f.look() is None  # handed out once
    (info,) = messages(caplog, logging.INFO)
    assert info == f"TLS files changed: the client connects with the new files from now on; changed: x.cert {a}, x.key {b}"


def test_a_kubelet_swap_is_one_change_and_a_look_never_raises(tmp_path, caplog):
    vol = SecretVolume(tmp_path / "secret", {"tls.crt": "c1", "tls.key": "k1"})
    crt, key = vol.root / "tls.crt", vol.root / "tls.key"
    now = [0.0]
    calls = []

    def load() -> str:
        calls.append(now[0])
        if len(calls) == 2:
            raise RuntimeError("a bug")
        return crt.read_text() + key.read_text()

    f = FollowedFiles((str(crt), str(key)), ("s.crt", "s.key"), load, "the client", LOG, clock=lambda: now[0],
                      interval_s=0.0)
    vol.update({"tls.crt": "c1", "tls.key": "k1"})  # the same contents in a new folder: a change
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        now[0] = 1.0
        assert f.look() is None  # the loader's bug: logged with its traceback, the files in force stay
        now[0] = 2.0
        assert f.look() == "c1k1"  # looked again: nothing was decided about them
    (failed,) = [r for r in caplog.records if "looking at the TLS files failed" in r.getMessage()]
    assert failed.exc_info is not None and "the client connects with the files it had" in failed.getMessage()
    vol.update({"tls.crt": "c2", "tls.key": "k2"})
    now[0] = 3.0
    assert f.look() == "c2k2" and len(calls) == 4
