"""The layering rules, enforced: who may import whom, and no import cycles.

* ``edgewise`` (the runtime core, the only library code a device gets) imports
  neither ``edge``, ``cloud`` nor ``edgewise_tools``;
* ``edge`` and ``cloud`` never import each other, nor the tools;
* the device packages (``edgewise``, ``edge``) use only the third-party modules
  listed here, so the Jetson bundle's requirements can be checked against them;
* no import cycle anywhere in the four packages.

Every import statement counts, wherever it stands (module level, inside a
function, under ``if TYPE_CHECKING``), and so does a string literal passed to
``importlib.import_module`` or ``__import__``: a lazy import is still a
dependency. A failure names the file, the line and the import.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edgewise", "edgewise_tools", "edge", "cloud")
#: package -> packages of this project it must not import
FORBIDDEN = {
    "edgewise": ("edge", "cloud", "edgewise_tools"),
    "edge": ("cloud", "edgewise_tools"),
    "cloud": ("edge", "edgewise_tools"),
    "edgewise_tools": (),
}
_CORE_THIRD_PARTY = {
    "numpy", "cv2", "yaml", "onnxruntime", "tensorrt", "grpc", "grpc_health",
    "google", "typing_extensions", "prometheus_client",
}
#: third-party top-level modules the device packages may import: what the bundle installs
#: (deploy/jetson/requirements.txt: numpy, onnxruntime, grpcio, protobuf as ``google``, PyYAML,
#: prometheus-client, paho-mqtt) or JetPack provides (cv2, tensorrt; CUDA only through ctypes),
#: plus typing_extensions, imported only on Pythons older than the device's 3.8. Anything else
#: (onnx, cuda-python, pycuda, torch) would be missing on a Jetson.
DEVICE_THIRD_PARTY = {
    "edgewise": _CORE_THIRD_PARTY,
    "edge": _CORE_THIRD_PARTY | {"paho"},
    # the paho client both MQTT ends share: imported only by the edge's MQTT transport and the
    # gateway's bridge, whose extras (edge, cloud) install paho-mqtt, as the bundle does
    # (test_only_the_mqtt_ends_import_the_shared_paho_client)
    "edgewise.mqtt_client": _CORE_THIRD_PARTY | {"paho"},
    # its reader of MQTT properties, installed by it; the bridge reads its verdict
    "edgewise.mqtt_properties": _CORE_THIRD_PARTY | {"paho"},
    # its select() over poll(2) for paho's network loop, installed by it
    "edgewise.mqtt_poll": _CORE_THIRD_PARTY | {"paho"},
}
#: the only modules that may import edgewise.mqtt_client, and edgewise.mqtt_properties
MQTT_CLIENT_USERS = {"edge.transports.mqtt", "cloud.gateway.mqtt_bridge"}
MQTT_PROPERTIES_USERS = {"edgewise.mqtt_client", "cloud.gateway.mqtt_bridge"}
MQTT_POLL_USERS = {"edgewise.mqtt_client"}

Import = Tuple[str, int, str]  # (file, line, imported module name)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> Dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("edgewise", "v1"):  # generated stubs
                continue
            out[_module_name(path)] = path
    return out


def _imports(mod: str, path: Path) -> Iterator[Tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{name}.{alias.name}" if alias.name != "*" else name
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str) and _is_dynamic_import(node.func)):
            yield node.lineno, node.args[0].value


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _resolve(name: str, modules: Dict[str, Path]) -> Optional[str]:
    """The project module ``name`` refers to (``a.b.C`` -> ``a.b``), or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _graph() -> Tuple[Dict[str, Path], Dict[str, List[Tuple[int, str]]], List[Import]]:
    modules = _sources()
    edges: Dict[str, List[Tuple[int, str]]] = {m: [] for m in modules}
    external: List[Import] = []
    for mod, path in modules.items():
        for line, name in _imports(mod, path):
            target = _resolve(name, modules)
            if target is not None and target != mod:
                edges[mod].append((line, target))
            elif target is None and name.split(".")[0] not in PACKAGES:
                external.append((mod, line, name))
    return modules, edges, external


def test_no_package_imports_a_layer_it_must_not() -> None:
    modules, edges, _ = _graph()
    bad = []
    for mod, deps in edges.items():
        pkg = mod.split(".")[0]
        for line, target in deps:
            if target.split(".")[0] in FORBIDDEN[pkg]:
                rel = modules[mod].relative_to(ROOT)
                bad.append(f"{rel}:{line} imports {target} ({pkg} must not import {target.split('.')[0]})")
    assert not bad, "layer violations:\n" + "\n".join(bad)


def test_device_packages_use_only_what_a_jetson_has() -> None:
    modules, _, external = _graph()
    std = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for mod, line, name in external:
        pkg, top = mod.split(".")[0], name.split(".")[0]
        allowed = DEVICE_THIRD_PARTY.get(mod, DEVICE_THIRD_PARTY.get(pkg))
        if allowed is not None and top not in std and top not in allowed:
            bad.append(f"{modules[mod].relative_to(ROOT)}:{line} imports {name} "
                       f"(not among the device's packages: {', '.join(sorted(allowed))})")
    assert not bad, "\n".join(bad)


def test_only_the_mqtt_ends_import_the_shared_paho_client() -> None:
    """edgewise.mqtt_client imports paho, which the core's own dependencies do not install:
    only the two MQTT ends may import it."""
    _, edges, _ = _graph()
    users = {mod for mod, deps in edges.items() for _, target in deps if target == "edgewise.mqtt_client"}
    assert users == MQTT_CLIENT_USERS
    users = {mod for mod, deps in edges.items() for _, target in deps if target == "edgewise.mqtt_properties"}
    assert users == MQTT_PROPERTIES_USERS
    users = {mod for mod, deps in edges.items() for _, target in deps if target == "edgewise.mqtt_poll"}
    assert users == MQTT_POLL_USERS


def _cycles(edges: Dict[str, List[Tuple[int, str]]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter([t for _, t in edges[root]]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter([t for _, t in edges[nxt]])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_cycles() -> None:
    modules, edges, _ = _graph()
    msgs = []
    for comp in _cycles(edges):
        members = set(comp)
        links = [f"  {modules[m].relative_to(ROOT)}:{line} imports {t}"
                 for m in comp for line, t in edges[m] if t in members]
        msgs.append(f"cycle between {', '.join(comp)}:\n" + "\n".join(links))
    assert not msgs, "\n".join(msgs)


def test_the_checker_sees_lazy_and_dynamic_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import importlib\n\ndef f():\n    from edge import settings\n"
                   "    importlib.import_module('cloud.local')\n    __import__('edgewise_tools.cli')\n")
    names = [n for _, n in _imports("edgewise.m", src)]
    assert {"edge.settings", "cloud.local", "edgewise_tools.cli"} <= set(names)
