"""A tiny settings schema exercising every shape the loader supports (no process needed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from edgewise.settings import Flag, Invalid, Schema, setting


@dataclass
class Item:
    """One list item; ``name`` has no default (required in a new item)."""

    name: str = setting("Item name.")
    weight: float = setting("Item weight.", 1.0, lo=0, lo_open=True)


@dataclass
class Net:
    """A nested section."""

    host: str = setting("Host.", "localhost")
    port: int = setting("Port.", 80, lo=1, hi=65535)
    tls: bool = setting("Use TLS.", False)
    token: str = setting("Bearer token.", "", secret=True)
    mode: str = setting("Mode.", "a", choices=("a", "b"))


def default_items() -> List[Item]:
    return [Item("x", 2.0), Item("y")]


@dataclass
class Root:
    """The root of the test schema."""

    name: str = setting("Name.", "n")
    ratio: Optional[float] = setting("A ratio, or null.", None, lo=0, hi=1)
    tags: List[str] = setting("Tags.", factory=list)
    sizes: Tuple[int, ...] = setting("Sizes.", (), lo=1)
    pair: Tuple[float, float] = setting("A pair.", (1.0, 2.0))
    net: Net = setting("Network.", factory=Net)
    items: List[Item] = setting("Items.", factory=default_items)
    extra: Dict[str, Any] = setting("Free-form options.", factory=dict)


def validate(r: Root) -> None:
    if r.net.tls and r.net.port == 80:
        raise Invalid("net.port", "must not be 80 with tls", also=("net.tls",))
    if len({i.name for i in r.items}) != len(r.items):
        raise Invalid(f"items[{len(r.items) - 1}].name", "duplicate item name")


SCHEMA: Schema[Root] = Schema(
    "test", Root, command="edgewise test", validate=validate,
    flags=(Flag("--port", "net.port"), Flag("--tag", "tags", repeat=True), Flag("--tls", "net.tls", switch=True),
           Flag("--https", "net.tls", switch=True, implies=(("net.port", 443),), help="TLS on port 443")),
)


@pytest.fixture
def schema() -> Schema[Root]:
    return SCHEMA


@pytest.fixture
def yaml_file(tmp_path: Path):
    def write(text: str) -> Path:
        p = tmp_path / "s.yaml"
        p.write_text(text, encoding="utf-8")
        return p

    return write
