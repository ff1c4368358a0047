"""The walkthrough of docs/install-cloud.md, run as written.

Its shell blocks run in bash in an empty directory (openssl, files, variables for real);
``kubectl``, ``helm`` and ``edgewise`` are recorded instead of sent to a cluster, then
replayed here: ``kubectl create secret`` as a client-side dry run (the Secrets kept),
other kubectl commands checked for their flags and the objects they name,
``helm install``/``upgrade``/``rollback`` rendered with the values each revision would
have, and every ``helm test`` and ``edgewise cloud probe`` run against a gateway started
from the rendered configuration and the Secrets' files (``tests/charts/simcluster.py``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml

from cloud.local import LocalCloud
from tests.charts.helm import CHART, named, render_text
from tests.charts.simcluster import SimCluster

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "install-cloud.md"
SECTION = "## Walkthrough: "
RECORDER = "import json, os, sys\nwith open(os.environ['WALKTHROUGH_LOG'], 'a') as f:\n" \
           "    f.write(json.dumps({'tool': os.path.basename(sys.argv[0]), 'argv': sys.argv[1:], 'cwd': os.getcwd()}) + '\\n')\n"
#: helm flags the replay models: with a value (-> its name here), and switches
HELM_FLAGS_WITH_VALUE = {"-n": "namespace", "--namespace": "namespace", "-f": "values", "--values": "values",
                         "--set": "set"}
HELM_SWITCHES = {"--reuse-values", "--reset-then-reuse-values", "--logs"}


def walkthrough_blocks() -> List[str]:
    text = GUIDE.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + 1)
    return re.findall(r"```sh\n(.*?)```", text[start:end], re.S)


def _helm_parse(argv: List[str]) -> Tuple[List[str], Dict[str, List[str]], bool]:
    """(positional args, flag -> values, --reuse-values) of a recorded helm command."""
    pos: List[str] = []
    flags: Dict[str, List[str]] = {}
    reuse = False
    words = iter(argv)
    for a in words:
        if a in HELM_FLAGS_WITH_VALUE:
            flags.setdefault(HELM_FLAGS_WITH_VALUE[a], []).append(next(words))
        elif a.startswith("-"):
            assert a in HELM_SWITCHES, f"helm flag {a} is not modelled by this test"
            reuse = reuse or a in ("--reuse-values", "--reset-then-reuse-values")  # the same chart: the same values
        else:
            pos.append(a)
    return pos, flags, reuse


class Replay:
    def __init__(self, workdir: Path, model: Path) -> None:
        self.dir = workdir
        self.model = model
        self.cluster: Optional[SimCluster] = None
        self.revisions: List[List[str]] = []  # helm args (-f absolute, --set) per revision
        self.docs: List[Dict[str, Any]] = []
        self.release = ""
        self.namespace = ""
        self.cloud: Optional[LocalCloud] = None
        self.cloud_settings: Dict[str, Any] = {}
        self.probes = 0

    def close(self) -> None:
        if self.cloud is not None:
            self.cloud.stop()

    def _render(self, args: List[str]) -> None:
        text = render_text(release=self.release, namespace=self.namespace, extra=tuple(args))
        self.docs = [d for d in yaml.safe_load_all(text) if d]
        self.revisions.append(args)

    def worker_model(self) -> str:
        args = named(self.docs, "Deployment", "-worker")["spec"]["template"]["spec"]["containers"][0]["args"]
        return next(a.split("=", 1)[1] for a in args if a.startswith("--model="))

    def _gateway(self) -> LocalCloud:
        assert self.cluster is not None and self.docs, "a probe before any helm install"
        settings = self.cluster.gateway_settings(self.docs)
        if self.cloud is None or settings != self.cloud_settings:
            if self.cloud is not None:
                self.cloud.stop()
            self.cloud = LocalCloud(self.model, workers=1, gateway_settings=settings)
            self.cloud.start()
            self.cloud_settings = settings
        return self.cloud

    def kubectl(self, argv: List[str], cwd: str) -> None:
        if self.cluster is None:  # the walkthrough's namespace: created first, or named with -n
            ns = argv[2] if argv[:2] == ["create", "namespace"] else argv[argv.index("-n") + 1]
            self.cluster = SimCluster(Path(cwd), ns)
        if "rollout" in argv or "port-forward" in argv:
            kind, _, name = argv[-1].partition("/")
            kinds = {"deploy": "Deployment", "deployment": "Deployment", "svc": "Service", "service": "Service"}
            assert [d for d in self.docs if d["kind"] == kinds[kind] and d["metadata"]["name"] == name], \
                f"kubectl {' '.join(argv)}: the release renders no {kind}/{name}"
        self.cluster.kubectl(argv)

    def helm(self, argv: List[str], cwd: str) -> None:
        pos, flags, reuse = _helm_parse(argv)
        cmd = pos[0]
        if cmd in ("install", "upgrade"):
            self.release, chart = pos[1], pos[2]
            assert (ROOT / chart).resolve() == CHART, f"helm {cmd}: chart {chart} is not charts/edgewise"
            self.namespace = flags.get("namespace", [self.namespace])[0]
            assert self.cluster is not None and self.namespace == self.cluster.namespace, \
                f"helm {cmd} into {self.namespace!r}, the Secrets were made in another namespace"
            args = list(self.revisions[-1]) if reuse else []
            for f in flags.get("values", []):
                args += ["-f", str(Path(cwd) / f)]
            for s in flags.get("set", []):
                args += ["--set", s]
            self._render(args)
        elif cmd == "rollback":
            assert pos[1] == self.release
            self._render(list(self.revisions[int(pos[2]) - 1]))
        elif cmd == "history":
            assert pos[1] == self.release and self.revisions
        elif cmd == "test":
            assert pos[1] == self.release
            assert self.cluster is not None
            out = self.cluster.run_helm_test(self.docs, self._gateway().address)
            assert out.returncode == 0, f"helm test after revision {len(self.revisions)}: {out.stdout}{out.stderr}"
            assert json.loads(out.stdout.strip().splitlines()[-1])["status"] == "OK"
            self.probes += 1
        else:
            raise AssertionError(f"helm {cmd} is not modelled by this test")

    def edgewise(self, argv: List[str], cwd: str) -> None:
        assert argv[:2] == ["cloud", "probe"], f"edgewise {' '.join(argv)} is not modelled by this test"
        target = argv[argv.index("--target") + 1]
        # DNS would resolve the public name to the load balancer; here: the local gateway
        args = [a if a != target else self._gateway().address for a in argv]
        args += ["--tls-server-name", target.rsplit(":", 1)[0]]
        out = subprocess.run([sys.executable, "-m", "edgewise.cli", *args], cwd=cwd, capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert out.returncode == 0, out.stdout + out.stderr
        self.probes += 1


def test_walkthrough_has_every_step() -> None:
    script = "\n".join(walkthrough_blocks())
    for step in ("openssl req -x509", "kubectl create namespace", "create secret tls", "helm install",
                 "helm test", "edgewise cloud probe", "helm upgrade", "--reset-then-reuse-values", "helm rollback"):
        assert step in script, step


def test_walkthrough_runs(tmp_path: Path, tiny_model: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("kubectl", "helm", "edgewise"):
        exe = bindir / tool
        exe.write_text(f"#!{sys.executable}\n{RECORDER}")
        exe.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    script = work / "walkthrough.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(walkthrough_blocks()))
    log = tmp_path / "records.jsonl"
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}", WALKTHROUGH_LOG=str(log))
    out = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    replay = Replay(work, tiny_model)
    models: List[str] = []
    try:
        for rec in map(json.loads, log.read_text().splitlines()):
            getattr(replay, rec["tool"])(rec["argv"], rec["cwd"])
            if rec["tool"] == "helm" and rec["argv"][0] in ("install", "upgrade", "rollback"):
                models.append(replay.worker_model())
    finally:
        replay.close()
    # install, upgrade to a new model, roll back to the shipped one; a probe after each
    assert models == ["/models/cloud.onnx", "/models/yolov5x-2025-06.onnx", "/models/cloud.onnx"]
    assert replay.probes == 4
    assert replay.cluster is not None and {"edgewise-grpc-tls", "edgewise-ca", "edgewise-tokens",
                                           "edgewise-probe-token"} <= set(replay.cluster.secrets)


def test_unmodelled_helm_flags_fail_the_replay() -> None:
    assert _helm_parse(["upgrade", "r", "c", "-n", "ns", "--reuse-values", "--set", "a=1"]) == \
        (["upgrade", "r", "c"], {"namespace": ["ns"], "set": ["a=1"]}, True)
    with pytest.raises(AssertionError, match="--wait is not modelled"):
        _helm_parse(["install", "x", "charts/edgewise", "--wait"])


# --------------------------------------------------------------------------- every command of the guide

def guide_commands(tool: str) -> List[List[str]]:
    """argv (after the program) of every ``tool`` command in the guide's shell blocks,
    continuation lines joined, heredoc bodies skipped, cut at a pipe or ``&&``."""
    found: List[List[str]] = []
    for block in re.findall(r"```sh\n(.*?)```", GUIDE.read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        lines = iter(text.splitlines())
        for line in lines:
            if "<<" in line:  # skip to the heredoc's end marker
                end = line.split("<<", 1)[1].strip().strip("'\"")
                for body in lines:
                    if body.strip() == end:
                        break
            words = shlex.split(line, comments=True)
            for i, w in enumerate(words):
                if w in ("|", "&&", ";", ">", ">>"):
                    words = words[:i]
                    break
            if words and words[0] == tool:
                found.append(words[1:])
    return found


def _help_flags(tool_path: str, words: List[str]) -> str:
    out = subprocess.run([tool_path, *words, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"{tool_path} {' '.join(words)}: {out.stderr}"
    return out.stdout


@pytest.mark.parametrize("tool", ["helm", "kubectl"])
def test_every_command_of_the_guide_renders_or_parses(tool: str, tmp_path: Path) -> None:
    """helm install/upgrade commands render (``helm template`` with their values); every
    other helm and kubectl command names real subcommands and flags."""
    from tests.charts.helm import tool as tool_path

    exe = tool_path(tool)
    commands = guide_commands(tool)
    assert len(commands) >= (10 if tool == "helm" else 8)
    global_flags = subprocess.run([exe, "options"], capture_output=True, text=True).stdout if tool == "kubectl" else ""
    (tmp_path / "charts").symlink_to(ROOT / "charts")  # commands run next to a checkout
    for argv in commands:
        words = [w for w in argv if not w.startswith("-")]
        flags = [w.split("=")[0] for w in argv if w.startswith("-")]
        if tool == "helm" and words[0] in ("install", "upgrade"):
            args = [a for a in argv[1:] if a not in ("--install", "--reuse-values", "--reset-then-reuse-values")]
            for i, a in enumerate(args):
                if a in ("-f", "--values") and not (tmp_path / args[i + 1]).exists():
                    (tmp_path / args[i + 1]).write_text("{}\n")  # the reader's own values file
            out = subprocess.run([exe, "template", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, f"helm {' '.join(argv)}: {out.stderr}"
            continue
        if tool == "kubectl" and "-n" in argv:
            words.remove(argv[argv.index("-n") + 1])
        text = _help_flags(exe, words) + global_flags
        unknown = [f for f in flags if not re.search(rf"(^|[\s,]){re.escape(f)}([=\s,\[]|$)", text, re.M)]
        assert not unknown, f"{tool} {' '.join(argv)}: no flag {unknown}"
