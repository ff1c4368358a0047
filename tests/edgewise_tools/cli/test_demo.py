"""``edgewise demo`` refuses a frame rate that is not a finite number above 0, and a report folder
it could not write its report into, before it starts anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgewise.cli import main


@pytest.mark.parametrize("fps", ["nan", "inf", "-inf", "0", "-1", "1e309", "abc"])
def test_fps_must_be_a_finite_number_above_zero(fps: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", f"--fps={fps}"])
    assert exc.value.code == 2
    assert "argument --fps: must be a" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["index.html", "summary.json"])
def test_a_report_file_that_cannot_be_written_is_refused_before_anything_starts(
        name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder where the demo writes its report was found only after the whole run."""
    import edgewise_tools.demo

    def started(*_args: Any, **_kw: Any) -> Any:
        raise AssertionError("the demo started")

    monkeypatch.setattr(edgewise_tools.demo, "run_demo", started)
    (tmp_path / name).mkdir()
    assert main(["demo", "--short", "--out", str(tmp_path)]) == 2
    assert (f"edgewise: error: --out {tmp_path}: {tmp_path / name} is a folder, where this command writes its "
            f"{name}; move it away or choose another folder") in capsys.readouterr().err
