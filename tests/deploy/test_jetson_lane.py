"""The Jetson lane (``edgewise_tools/jetson_lane.py``), run by ``make test`` on every CI machine.

* the aarch64/cp38 ``pip download`` of the bundle's own requirements + constraints resolves;
* a real CPython 3.8 venv made by the bundle's ``setup.sh`` from the same pins runs the device
  test suites;
* the .deb's tree (no ``edgewise_tools``, no onnx) under that interpreter: every command the
  service units, the L4T entry point, postinst and the man page name exists, and a
  provisioned ``edge run`` of a few dozen frames escalates to a real local gateway (run by
  this, the main, interpreter).

Without a CPython 3.8 the lane fails and says how to get one. Its wall time with the venv
cached and on a fresh machine: README.md, "The Jetson lane".
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from edge import bundle as B
from edgewise_tools import jetson_lane as J
from edgewise_tools.demo.records import accounting, latest_per_frame
from tests.edge.helpers import policy_yaml, read_jsonl

pytestmark = pytest.mark.timeout(1800)
ROOT = Path(__file__).resolve().parents[2]


def test_aarch64_resolution_of_the_bundle_files() -> None:
    wheels = J.resolve_aarch64(J.CACHE / "wheels-aarch64")
    joined = " ".join(wheels)
    for name in ("grpcio-1.70.0-cp38", "numpy-1.23.5-cp38", "onnxruntime-1.16.3-cp38", "protobuf-5.29.3"):
        assert name in joined and "aarch64" in next(w for w in wheels if w.startswith(name)), joined
    assert not any(w.startswith(("onnx-", "torch", "opencv", "tensorrt")) for w in wheels), joined


def test_no_python38_says_how_to_get_one(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEWISE_PYTHON38", str(tmp_path / "nope"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(J.LaneError, match=r"pyenv install 3\.8\.18.*EDGEWISE_PYTHON38"):
        J.find_python38()


@pytest.fixture(scope="module")
def lane(tiny_model, small_model, native_model) -> J.Lane:
    """The cached device venv (models built first: the lane's Python has no torch)."""
    try:
        return J.Lane().ensure()
    except J.LaneError as exc:
        pytest.fail(str(exc))


def test_the_venv_holds_exactly_the_pinned_set(lane: J.Lane) -> None:
    frozen = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
              for line in lane.freeze().splitlines() if "==" in line}
    want = {n.lower().replace("_", "-"): v for n, v in B.device_pins() if n != "pip"}
    want["opencv-python-headless"] = "4.5.4.60"  # the stand-in for JetPack's OpenCV
    assert {k: v for k, v in frozen.items() if k != "setuptools"} == want


def test_device_suites_under_python38(lane: J.Lane) -> None:
    proc = lane.run_device_tests()
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert re.search(r"\d+ passed", proc.stdout)


def named_commands() -> set:
    """``edge <sub>`` of every edgewise-edge command line the packaging names."""
    texts = [(B.JETSON / f).read_text() for f in (*B.UNITS, "Dockerfile.l4t", "debian/postinst")]
    texts.append(B._MANPAGE)
    found = set()
    for text in texts:
        for m in re.finditer(r"edgewise-edge[ \t]+(\w+)[ \t]+([\w-]+)", text.replace("\\-", "-")):
            found.add((m.group(1), m.group(2)))
    return found


def test_the_packaging_names_only_device_commands() -> None:
    assert named_commands() == {("edge", c) for c in ("run", "check-config", "check-policy", "engine",
                                                      "model-info", "provision")}


def _device(lane: J.Lane, tree: Path, *args: str, env: dict = None, timeout: float = 120):
    """``/usr/bin/edgewise-edge ARGS``: the bundled tree under the device interpreter."""
    full = dict(lane.env(tree / "usr/lib/edgewise-edge/python"), **(env or {}))
    return subprocess.run([str(lane.python), "-m", "edgewise", *args], capture_output=True, text=True,
                          cwd=tree, env=full, timeout=timeout)


def test_bundled_tree_under_python38_runs_every_named_command_and_escalates(lane: J.Lane, tiny_model: Path,
                                                                            tmp_path: Path) -> None:
    from cloud.local import LocalCloud

    dpkg = shutil.which("dpkg-deb")
    if dpkg is None:
        pytest.fail("dpkg-deb is not installed; `make test` installs it with apt-get")
    tree = tmp_path / "tree"  # what `apt install` puts on the device
    deb = B.bundle(B.BundleOptions(out_dir=tmp_path / "dist")).deb  # as shipped: the camera pair's INT8 edge model
    subprocess.run([dpkg, "-x", str(deb), str(tree)], check=True)
    py = tree / "usr/lib/edgewise-edge/python"
    assert not (py / "edgewise_tools").exists() and not (py / "cloud").exists()
    for group, sub in sorted(named_commands()):
        proc = _device(lane, tree, group, sub, "--help")
        assert proc.returncode == 0, f"edgewise-edge {group} {sub}: {proc.stderr}"

    model = tree / "usr/share/edgewise-edge/models/edge.onnx"
    info = _device(lane, tree, "edge", "model-info", str(model))
    assert info.returncode == 0 and "YOLOv5 detector" in info.stdout, info.stderr
    pol = _device(lane, tree, "edge", "check-policy", str(tree / "etc/edgewise/policy.yaml"))
    assert pol.returncode == 0, pol.stderr

    state = tmp_path / "state"
    (tmp_path / "policy.yaml").write_text(policy_yaml("lane", {"cam": "always"}, deadline_ms=5000))
    (tmp_path / "template.yaml").write_text(yaml.safe_dump({
        "streams": [{"id": "cam", "kind": "synthetic", "uri": "160x120", "fps": 10, "max_frames": 36}],
        "model": {"path": str(model), "backend": "auto", "max_batch": 2},
        "policy_file": str(tmp_path / "policy.yaml"),
        "cloud": {"endpoints": ["gateway.example.com:50051"]},
        "spool": {"path": str(state / "spool.db")}, "sinks": {"jsonl": str(state / "detections.jsonl")},
        "metrics": {"port": -1}, "shutdown_grace_s": 10.0,
    }))
    (tmp_path / "token").write_text("tok-lane-1")
    with LocalCloud(tiny_model, workers=1, gateway_settings={
            "auth.tokens": [{"device": "lane-1", "token": "tok-lane-1"}]}) as cloud:
        prov = _device(lane, tree, "edge", "provision", "--root", str(tree), "--template",
                       str(tmp_path / "template.yaml"), "--device-id", "lane-1", "--endpoint", cloud.address,
                       "--token-file", str(tmp_path / "token"))
        assert prov.returncode == 0, prov.stderr
        conf = tree / "etc/edgewise/edge.yaml"
        envfile = tree / "etc/default/edgewise-edge"
        assert stat.S_IMODE(envfile.stat().st_mode) == 0o600 and stat.S_IMODE(conf.stat().st_mode) == 0o640
        token_env = dict(line.split("=", 1) for line in envfile.read_text().splitlines() if "=" in line)
        for sub in ("check-config", "engine"):  # the unit's ExecStartPre, postinst's check
            proc = _device(lane, tree, "edge", sub, "--config", str(conf), env=token_env)
            assert proc.returncode == 0, f"{sub}: {proc.stderr}"
        assert "device id lane-1" in _device(lane, tree, "edge", "check-config", "--config", str(conf)).stdout
        run = _device(lane, tree, "edge", "run", "--config", str(conf), env=token_env, timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]
        # the shipped policy (motion signals, regions, carried answers) on frames of the camera world:
        # the plain pattern's digits are drawn thin by the device's OpenCV 4.5.4 (bold by 5.x), and
        # the edge model saw nearly nothing in them
        shipped = yaml.safe_load(conf.read_text())
        shipped.update(policy_file=str(tree / "etc/edgewise/policy.yaml"),
                       streams=[{"id": "cam", "kind": "synthetic", "uri": "digits:camera:1280x720", "fps": 10,
                                 "max_frames": 40}],
                       spool={"path": str(tmp_path / "shipped" / "spool.db")},
                       sinks={"jsonl": str(tmp_path / "shipped" / "detections.jsonl")})
        (tmp_path / "shipped.yaml").write_text(yaml.safe_dump(shipped))
        run = _device(lane, tree, "edge", "run", "--config", str(tmp_path / "shipped.yaml"), env=token_env,
                      timeout=240)
        assert run.returncode == 0, run.stderr[-3000:]

    recs = read_jsonl(state / "detections.jsonl")
    assert len(recs) == 36 and {r["device"] for r in recs} == {"lane-1"}
    answered = {r["frame_seq"] for r in recs if r["outcome"] == "cloud"}
    assert answered == {r["frame_seq"] for r in recs if not r.get("late")}, [r["outcome"] for r in recs]
    assert all(d["source"] in ("edge", "cloud") for r in recs for d in r["detections"])
    final = latest_per_frame(read_jsonl(tmp_path / "shipped" / "detections.jsonl"))
    acct = accounting(final)
    assert acct["frames"] == 40 and acct["escalated"] >= 1 and acct["lost"] == 0, acct
    sent = [r for r in final.values() if r.get("escalated")]
    assert {r["payload"] for r in sent} <= {"regions", "full"} and any(r["payload"] == "regions" for r in sent), sent
    bad = _device(lane, tree, "edge", "run", "--config", str(conf), "--set", "spool.path=/dev/null/x/spool.db")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert bad.stderr.startswith("edgewise: error: spool.path /dev/null/x/spool.db: the folder")
    assert os.path.exists(state / "spool.db")
