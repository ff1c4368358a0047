"""Reading a settings file: the one piece every process's settings loader shares.

The edge daemon, the gateway, the worker and the autoscaler each build their own
settings tree (their keys differ), but they read the YAML file the same way and
must fail the same way: the message names the file and says what is wrong.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from typing import Any, Dict, Union

import yaml

from edgewise.errors import ConfigError


def read_yaml_mapping(path: Union[str, Path], what: str = "settings") -> Dict[str, Any]:
    """The mapping at the top of a YAML file (``{}`` for an empty file).

    Raises:
        ConfigError: the file cannot be read, is not YAML, or its top level is not
            a mapping; the message starts with the path.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of {what}")
    return data


def attribute_docs(cls: Any) -> Dict[str, str]:
    """Docstrings written under dataclass fields (``x: int = 0`` then ``\"\"\"doc\"\"\"``)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(src)
    docs: Dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        body = node.body
        for i, stmt in enumerate(body[:-1]):
            nxt = body[i + 1]
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs
