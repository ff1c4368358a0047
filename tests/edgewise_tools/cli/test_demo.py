"""``edgewise demo`` refuses a frame rate that is not a finite number above 0 before it starts anything."""

from __future__ import annotations

import pytest

from edgewise.cli import main


@pytest.mark.parametrize("fps", ["nan", "inf", "-inf", "0", "-1", "1e309", "abc"])
def test_fps_must_be_a_finite_number_above_zero(fps: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", f"--fps={fps}"])
    assert exc.value.code == 2
    assert "argument --fps: must be a" in capsys.readouterr().err
