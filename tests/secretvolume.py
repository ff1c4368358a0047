"""A folder laid out and updated the way kubelet mounts a Secret or ConfigMap, for the tests of
files followed without a restart (the gateway's device tokens and TLS certificates, the chart
broker's TLS files)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class SecretVolume:
    """A folder as kubelet mounts a Secret (``atomic_writer.go``): each key is a link
    ``<key> -> ..data/<key>``, ``..data`` a link to a timestamped folder holding the files. An
    update writes the new files into a new timestamped folder, points a new link ``..data_tmp``
    at it and renames that over ``..data`` (one atomic step), then removes the old folder."""

    def __init__(self, root: Path, files: dict[str, str | bytes]) -> None:
        self.root = root
        self.version = 0
        root.mkdir()
        self.update(files)

    def update(self, files: dict[str, str | bytes]) -> None:
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        self.version += 1
        new = self.root / f"..2025_06_01_12_00_{self.version:02d}.000000001"
        new.mkdir()
        for key, content in files.items():
            (new / key).write_bytes(content if isinstance(content, bytes) else content.encode())
        tmp = self.root / "..data_tmp"
        os.symlink(new.name, tmp)
        os.rename(tmp, data)
        for key in files:
            if not (self.root / key).is_symlink():
                os.symlink(f"..data/{key}", self.root / key)
        if old is not None:
            shutil.rmtree(self.root / old)
